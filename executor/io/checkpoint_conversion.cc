// Which reader and writer each direction takes.
#include "executor/io/checkpoint_conversion.h"

#include <filesystem>

#include "core/error.h"
#include "core/parallel_plan.h"
#include "executor/io/hf_checkpoint.h"
#include "executor/train/checkpoint.h"

namespace megaplan::exec {
namespace {

SafetensorsDtype dtype_of(const std::string& text) {
  if (text == "fp32") return SafetensorsDtype::kF32;
  if (text == "bf16") return SafetensorsDtype::kBF16;
  throw SpecError("--dtype", "must be fp32 or bf16, got \"" + text + "\"");
}

// Nothing is written over: the destination must not exist yet or be an empty directory.
void require_free(const std::string& path) {
  std::error_code error;
  if (std::filesystem::exists(path, error) && !std::filesystem::is_empty(path, error)) {
    throw SpecError("--save", path + " exists and is not empty");
  }
}

}  // namespace

void convert_checkpoint(const ConversionRequest& options, std::ostream& out) {
  if (options.to != "hf" && options.to != "megaplan") {
    throw SpecError("--to", "must be hf or megaplan, got \"" + options.to + "\"");
  }
  require_free(options.save);
  if (options.to == "hf") {
    const SafetensorsDtype dtype = dtype_of(options.dtype);
    const CheckpointWeights weights = read_checkpoint_weights(options.load);
    const std::string type = hf_model_type(weights.model, options.model_type);
    const HfTokenizerExport tokenizer = hf_tokenizer_export(weights.tokenizer, weights.model.vocab_size);
    const int64_t written = write_hf_checkpoint(options.save, weights.model, type, weights.tensors, dtype, tokenizer);
    out << "wrote " << options.save << ": " << type << ", " << written << " tensors of " << weights.model.name
        << " (vocabulary " << weights.model.vocab_size << ") in " << options.dtype << "\n"
        << tokenizer.note << "\n";
    return;
  }
  if (!options.model_type.empty()) throw SpecError("--model-type", "names the Hugging Face type --to hf writes");
  const HfCheckpoint checkpoint = read_hf_checkpoint(options.load);
  const int64_t world = options.plan.tensor_parallel_size * options.plan.pipeline_parallel_size;
  const ParallelPlan plan = resolve_plan(checkpoint.model, world, options.plan);
  validate_plan(checkpoint.model, plan);
  write_checkpoint_weights(options.save, checkpoint.model, plan, checkpoint.tensors, options.seed);
  out << "wrote " << options.save << ": " << checkpoint.tensors.size() << " tensors of " << checkpoint.model.name
      << " for tp " << plan.tensor_parallel_size << ", pp " << plan.pipeline_parallel_size
      << " (iteration 0, a fresh optimizer)\n";
}

}  // namespace megaplan::exec
