// `megaplan convert`: flag mapping, and which reader and writer each direction takes.
#include "cli/convert_command.h"

#include <filesystem>
#include <memory>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/parallel_plan.h"
#include "executor/io/hf_checkpoint.h"
#include "executor/train/checkpoint.h"

namespace megaplan::cli {

namespace {

exec::SafetensorsDtype dtype_of(const std::string& text) {
  if (text == "fp32") return exec::SafetensorsDtype::kF32;
  if (text == "bf16") return exec::SafetensorsDtype::kBF16;
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

int run_convert(const ConvertOptions& options, std::ostream& out) {
  if (options.to != "hf" && options.to != "megaplan") {
    throw SpecError("--to", "must be hf or megaplan, got \"" + options.to + "\"");
  }
  require_free(options.save);
  if (options.to == "hf") {
    const exec::SafetensorsDtype dtype = dtype_of(options.dtype);
    const exec::CheckpointWeights weights = exec::read_checkpoint_weights(options.load);
    const std::string type = exec::hf_model_type(weights.model, options.model_type);
    const exec::HfTokenizerExport tokenizer = exec::hf_tokenizer_export(weights.tokenizer, weights.model.vocab_size);
    const int64_t written =
        exec::write_hf_checkpoint(options.save, weights.model, type, weights.tensors, dtype, tokenizer);
    out << "wrote " << options.save << ": " << type << ", " << written << " tensors of " << weights.model.name
        << " (vocabulary " << weights.model.vocab_size << ") in " << options.dtype << "\n"
        << tokenizer.note << "\n";
    return 0;
  }
  if (!options.model_type.empty()) throw SpecError("--model-type", "names the Hugging Face type --to hf writes");
  const exec::HfCheckpoint checkpoint = exec::read_hf_checkpoint(options.load);
  const int64_t world = options.plan.tensor_parallel_size * options.plan.pipeline_parallel_size;
  const ParallelPlan plan = resolve_plan(checkpoint.model, world, options.plan);
  validate_plan(checkpoint.model, plan);
  exec::write_checkpoint_weights(options.save, checkpoint.model, plan, checkpoint.tensors, options.seed);
  out << "wrote " << options.save << ": " << checkpoint.tensors.size() << " tensors of " << checkpoint.model.name
      << " for tp " << plan.tensor_parallel_size << ", pp " << plan.pipeline_parallel_size
      << " (iteration 0, a fresh optimizer)\n";
  return 0;
}

void setup_convert_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<ConvertOptions>();
  CLI::App* command = app.add_subcommand(
      "convert", "Convert a megaplan checkpoint to a Hugging Face directory (config.json, safetensors), or back");
  command->add_option("--to", options->to, "hf or megaplan")->required();
  command->add_option("--load", options->load, "The checkpoint directory (--to hf) or Hugging Face directory")
      ->required();
  command->add_option("--save", options->save, "Where to write; must not exist or be empty")->required();
  command->add_option("--dtype", options->dtype, "--to hf: fp32 (every bit kept) or bf16")->capture_default_str();
  command->add_option("--model-type", options->model_type,
                      "--to hf: llama, mistral, qwen2 or gpt2 (default: from the architecture)");
  command->add_option("--seed", options->seed, "--to megaplan: the data order training from it draws")
      ->capture_default_str();
  add_plan_options(*command, options->plan);
  command->callback([options, &context] { context.exit_code = run_convert(*options, context.out); });
}

}  // namespace megaplan::cli
