// A checkpoint's weights alone, for `megaplan convert`: read whole (read_checkpoint_weights) and
// written as a checkpoint with a fresh optimizer (write_checkpoint_weights), checkpoint.h's rules.
#include <filesystem>
#include <stdexcept>

#include "core/error.h"
#include "core/parameter_list.h"
#include "executor/io/parallel_tasks.h"
#include "executor/io/staged_file.h"
#include "executor/model/stage_chunk.h"
#include "executor/train/checkpoint.h"
#include "executor/train/checkpoint_format.h"
#include "executor/train/checkpoint_manifest.h"
#include "executor/train/checkpoint_rank_writer.h"
#include "executor/train/checkpoint_reshard.h"
#include "executor/train/checkpoint_shard_reader.h"
#include "executor/train/checkpoint_staging.h"
#include "executor/train/checkpoint_state_file.h"
#include "executor/train/parallel_groups.h"

namespace megaplan::exec {

namespace checkpoint_format {
namespace {

CheckpointWeights read_weights(const std::string& directory) {
  try {
    std::optional<Newest> newest = find_newest(directory);
    if (!newest) refuse_load(directory + " holds no checkpoint (no latest_checkpointed_iteration.txt)");
    CheckpointWeights weights;
    if (!newest->meta.contains("model_spec")) {
      refuse_load(newest->path + "/state.json names no model_spec (a checkpoint saved before megaplan recorded it)");
    }
    weights.model = model_spec_from_json(newest->meta["model_spec"], newest->path + "/state.json: model_spec");
    validate_model_spec(weights.model);
    weights.tokenizer = newest->state.tokenizer;
    // A tied output layer's copy is the word embedding: left out.
    const auto kept = [&](const std::string& name) {
      return name != kOutputWeight || weights.model.untie_embeddings_and_output_weights;
    };
    std::vector<const SavedShard*> needed;
    for (const auto& [name, shards] : newest->saved) {
      if (!kept(name)) continue;
      for (const SavedShard* part : saved_parts(name, shards)) needed.push_back(part);
    }
    ShardBytes read;
    read_shards(needed, default_checkpoint_threads(), read);
    verify_unread_replicas(newest->saved, needed, default_checkpoint_threads(), [](const SavedShard&) { return true; });
    for (const auto& [name, shards] : newest->saved) {
      if (!kept(name)) continue;
      std::vector<std::vector<float>> arrays = assemble_tensor(name, shards, TensorCut{}, read);
      std::vector<int64_t> shape = shards.front().global_shape;
      if (vocabulary_tensor(name)) {
        // The true vocabulary's rows; the rest were the saving layout's padding.
        if (shape.size() != 2 || shape[0] < weights.model.vocab_size) {
          refuse_load(shards.front().manifest + ": " + name + " has global shape " + shape_text(shape) +
                      ", fewer rows than " + "the vocabulary of " + std::to_string(weights.model.vocab_size) +
                      " state.json records");
        }
        shape[0] = weights.model.vocab_size;
        set_rows(arrays, shape[0], shape[1]);
      }
      weights.tensors[name] = {shape, std::move(arrays[0])};
    }
    return weights;
  } catch (const SpecError& failure) {
    if (failure.field() == "--load") throw;
    throw SpecError("--load", failure.what());
  }
}

void write_weights(const std::string& directory, const ModelSpec& model, const ParallelPlan& plan,
                   const std::map<std::string, WholeTensor>& tensors, uint64_t seed) {
  TrainingState state;  // weights from elsewhere: iteration 0, no tokenizer known
  state.seed = seed;
  const std::string staging = create_staging(directory, state.iteration);
  try {
    // Each rank that would write a checkpoint of `plan` (its directory, and what it writes there).
    for (const RankPlace& writer : checkpoint_writers(model, plan)) {
      const int64_t p = writer.pipeline_rank, t = writer.tensor_parallel_rank, e = writer.expert_parallel_rank;
      std::vector<ParameterSpec> specs;
      const std::vector<int64_t> stages = stages_of_pipeline_rank(p, plan);
      for (const int64_t stage : stages) {
        for (ParameterSpec& spec : describe_parameters(model, plan, stage, t, e, writer.expert_tensor_parallel_rank)) {
          if (writes_parameter(writer.replica_rank, writer.expert_replica_rank, spec)) specs.push_back(std::move(spec));
        }
      }
      RankLayout layout;
      std::vector<TensorEntry> entries;
      for (const ParameterSpec& spec : specs) entries.push_back(entry_of(spec));
      layout.lay_out(std::move(entries));
      layout.tensor_parallel_rank = t;
      layout.pipeline_rank = p;
      layout.stages = stages;
      layout.binding = {state.iteration,
                        rank_directory(t, p, plan.pipeline_parallel_size, e, plan.expert_model_parallel_size),
                        parallel_plan_to_json(plan)};
      std::vector<float> image(layout.total_bytes / sizeof(float));
      for (std::size_t i = 0; i < specs.size(); ++i) {
        const ParameterSpec& spec = specs[i];
        // A tied output layer's copy starts as the word embedding, as training makes it.
        const bool copy = spec.name == kOutputWeight && !model.untie_embeddings_and_output_weights;
        const auto found = tensors.find(copy ? std::string(kWordEmbeddings) : spec.name);
        if (found == tensors.end()) throw std::logic_error("write_checkpoint_weights: no tensor " + spec.name);
        const WholeTensor& whole = found->second;
        // The vocabulary's rows padded to the layout's (Megatron's padding), with zeros.
        const bool vocabulary = copy || spec.name == kWordEmbeddings || spec.name == kOutputWeight;
        const bool padded = vocabulary && whole.shape.size() == 2 && whole.shape[0] < spec.global_shape[0] &&
                            whole.shape[1] == spec.global_shape[1];
        if (!padded && whole.shape != spec.global_shape) {
          throw SpecError("--save", spec.name + " has shape " + shape_text(whole.shape) + ", the model " +
                                        shape_text(spec.global_shape));
        }
        std::vector<std::vector<float>> parts(1, whole.values);
        if (padded) parts[0].resize(elements(spec.global_shape), 0.0f);
        const std::vector<float> value = reshard(parts, TensorCut{}, spec.global_shape, tensor_cut(spec));
        float* tensor = image.data() + layout.offsets[i] / sizeof(float);
        std::copy(value.begin(), value.end(), tensor);
        std::fill(tensor + value.size(), tensor + kArraysPerTensor * value.size(), 0.0f);  // a fresh optimizer's
      }
      write_rank_image(staging + "/" + layout.binding.directory, layout, reinterpret_cast<const char*>(image.data()),
                       default_checkpoint_threads());
    }
    write_file_atomically(staging + "/state.json", checkpoint_meta(state, model, plan).dump(2) + "\n");
    publish(directory, staging, state.iteration);
  } catch (...) {
    std::error_code error;
    std::filesystem::remove_all(staging, error);
    throw;
  }
}

}  // namespace
}  // namespace checkpoint_format

CheckpointWeights read_checkpoint_weights(const std::string& directory) {
  return checkpoint_format::read_weights(directory);
}

void write_checkpoint_weights(const std::string& directory, const ModelSpec& model, const ParallelPlan& plan,
                              const std::map<std::string, WholeTensor>& tensors, uint64_t seed) {
  checkpoint_format::write_weights(directory, model, plan, tensors, seed);
}

}  // namespace megaplan::exec
