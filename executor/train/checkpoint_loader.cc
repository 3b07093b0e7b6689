// Loads (load_checkpoint, checkpoint.h): the newest checkpoint checked against the model, then each
// of the rank's tensors read as saved when a saved shard is exactly its part (streamed from the
// file to the device through a small page-locked window), else resharded from the saved parts.
#include <algorithm>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"
#include "executor/runtime/pinned_host_buffer.h"
#include "executor/train/checkpoint.h"
#include "executor/train/checkpoint_format.h"
#include "executor/train/checkpoint_manifest.h"
#include "executor/train/checkpoint_reshard.h"
#include "executor/train/checkpoint_shard_reader.h"
#include "executor/train/checkpoint_state_file.h"

namespace megaplan::exec {

namespace checkpoint_format {
namespace {

// The saved shard that is exactly `parameter`'s part (the same global shape and cut) and streams,
// if any: its bytes are the parameter's as they lie in the file. Of a replicated tensor's copies,
// the one a tensor-parallel rank of this rank's place saved (its own, under the saving layout).
const SavedShard* shard_as_saved(const std::vector<SavedShard>& shards, const Parameter& parameter,
                                 const std::function<bool(const SavedShard&)>& mine) {
  const TensorCut wanted = tensor_cut(parameter);
  const SavedShard* found = nullptr;
  for (const SavedShard& shard : shards) {
    if (same_part(shard.cut, wanted) && shard.global_shape == parameter.global_shape && streamable(shard)) {
      if (mine(shard)) return &shard;
      if (!found) found = &shard;
    }
  }
  return found;
}

std::optional<TrainingState> load_latest(const std::string& directory, const CheckpointRank& rank,
                                         CheckpointLoadCounts* counts) {
  std::optional<Newest> newest = find_newest(directory);
  if (!newest) return std::nullopt;
  if (counts) counts->incomplete = newest->incomplete;
  const std::string& path = newest->path;
  const TrainingState state = newest->state;
  // Every tensor of every saved rank directory, and the tensors the model has over all its stages.
  const std::map<std::string, std::vector<SavedShard>>& saved = newest->saved;
  const bool untied = rank.model.untie_embeddings_and_output_weights;
  const int64_t vocabulary = rank.model.vocab_size;
  // The real rows must be the model's: another vocabulary's rows are other tokens, or padding.
  if (const auto spec = newest->meta.find("model_spec"); spec != newest->meta.end() && spec->is_object()) {
    if (const auto saved_vocabulary = spec->find("vocab_size");
        saved_vocabulary != spec->end() && saved_vocabulary->is_number_integer() && *saved_vocabulary != vocabulary) {
      refuse_load(path + "/state.json: the checkpoint's vocabulary is " + saved_vocabulary->dump() +
                  " tokens, the model's " + std::to_string(vocabulary) +
                  " (a checkpoint of another vocabulary: --vocab-size " + saved_vocabulary->dump() + " trains on it)");
    }
  }
  restore_expert_biases(state.expert_biases, rank.model, path + "/state.json", rank.chunks, rank.backend);
  std::map<std::string, std::vector<int64_t>> expected;  // name -> global shape
  for (int64_t stage = 0; stage < rank.plan.num_virtual_stages(); ++stage) {
    for (int64_t ep_rank = 0; ep_rank < rank.plan.expert_model_parallel_size; ++ep_rank) {  // every expert
      // Global shapes: any tp and etp rank's.
      for (const ParameterSpec& spec : describe_parameters(rank.model, rank.plan, stage, 0, ep_rank, 0)) {
        // The tied output layer's copy is the word embedding's: not a tensor of its own.
        if (spec.name != kOutputWeight || untied) expected[spec.name] = spec.global_shape;
      }
    }
  }
  for (const auto& [name, shards] : saved) {
    // The tied output layer's copy has the word embedding's shape; a layout without one ignores it.
    const auto found = expected.find(name == kOutputWeight && !untied ? kWordEmbeddings : name);
    if (found == expected.end()) {
      refuse_load(shards.front().manifest + ": the checkpoint holds " + name + ", which " + rank.model.name +
                  " does not have (a checkpoint of another model)");
    }
    const std::vector<int64_t>& saved_shape = shards.front().global_shape;
    if (saved_shape != found->second &&
        !(vocabulary_tensor(name) && other_padding(saved_shape, found->second, vocabulary))) {
      refuse_load(shards.front().manifest + ": " + name + " has global shape " + shape_text(saved_shape) +
                  " in the checkpoint but " + shape_text(found->second) + " in the model");
    }
    for (const SavedShard& shard : shards) {
      if (shard.global_shape != shards.front().global_shape) {
        refuse_load(shard.manifest + ": " + name + " has global shape " + shape_text(shard.global_shape) +
                    " here but " + shape_text(shards.front().global_shape) + " in " + shards.front().manifest);
      }
    }
  }
  for (const auto& [name, shape] : expected) {
    if (!saved.count(name)) {
      refuse_load(path + " holds no " + name + ", which the model needs (a checkpoint of another model)");
    }
  }

  // The tensor each parameter is read from: a tied output layer's copy is the word embedding when
  // the saving layout kept none.
  const auto source_of = [&](const Parameter& parameter) -> std::string {
    return parameter.name == kOutputWeight && !untied && !saved.count(parameter.name) ? kWordEmbeddings
                                                                                      : parameter.name;
  };
  // The replicas this rank reads or checks: those of the saving tp ranks congruent to its own,
  // on the first model replica only (the others load the same bytes).
  const int64_t loading_tp = rank.plan.tensor_parallel_size;
  const auto mine = [&](const SavedShard& shard) {
    return shard.tensor_parallel_rank % loading_tp == rank.groups.tensor_parallel_rank;
  };
  std::vector<const Parameter*> as_saved, resharded;
  std::vector<const SavedShard*> streamed;  // as_saved's shards
  for (StageChunk* chunk : rank.chunks) {
    for (const Parameter& parameter : chunk->parameters()) {
      if (const SavedShard* shard = shard_as_saved(saved.at(source_of(parameter)), parameter, mine)) {
        as_saved.push_back(&parameter);
        streamed.push_back(shard);
      } else {
        resharded.push_back(&parameter);
      }
    }
  }
  if (counts) {
    counts->tensors_as_saved = static_cast<int64_t>(as_saved.size());
    counts->tensors_resharded = static_cast<int64_t>(resharded.size());
  }

  // Streamed: each block uploaded from the window as read, the moments' through the optimizer.
  if (!streamed.empty()) {
    std::size_t blocks = 0;
    for (const SavedShard* shard : streamed) blocks += block_count(shard->bytes(), shard->block_bytes);
    const std::size_t slots = window_slots(blocks, rank.threads);
    PinnedHostBuffer window(rank.backend);
    stream_shards(
        streamed, rank.threads, window.reserve(slots * kChecksumBlockBytes), slots,
        [&](std::size_t k, uint64_t begin, const char* bytes, uint64_t size) {
          const Parameter& parameter = *as_saved[k];
          for_each_array_part(parameter.size, begin, size,
                              [&](std::size_t array, uint64_t first, uint64_t count, uint64_t into) {
                                const auto* host = reinterpret_cast<const float*>(bytes + into);
                                if (array == 0) {
                                  rank.backend.upload(parameter.value + first, host, count);
                                } else {
                                  rank.optimizer.import_moment(parameter, array == 2, first, host, count);
                                }
                              });
          if (counts) counts->bytes += size;
        },
        [&] { rank.backend.synchronize(); });
  }

  // Resharded: every saved part they take read at once (on several threads), then each joined and
  // cut, its value uploaded and its moments set through the optimizer.
  std::vector<const SavedShard*> needed;
  for (const Parameter* parameter : resharded) {
    const std::string source = source_of(*parameter);
    for (const SavedShard* part : saved_parts(source, saved.at(source))) needed.push_back(part);
  }
  ShardBytes read;
  read_shards(needed, rank.threads, read);
  std::vector<const SavedShard*> all_read = streamed;
  all_read.insert(all_read.end(), needed.begin(), needed.end());
  if (rank.groups.replica_rank == 0) verify_unread_replicas(saved, all_read, rank.threads, mine);
  if (counts) {
    for (const auto& [shard, bytes] : read) counts->bytes += shard->bytes();
  }
  for (const Parameter* parameter : resharded) {
    const std::string source = source_of(*parameter);
    const std::vector<SavedShard>& shards = saved.at(source);
    const std::vector<int64_t>& saved_shape = shards.front().global_shape;
    std::vector<std::vector<float>> arrays;
    if (saved_shape == parameter->global_shape) {
      arrays = assemble_tensor(source, shards, tensor_cut(*parameter), read);
    } else {
      // The vocabulary under another padding: the whole tensor with this layout's rows, then this
      // rank's part of it.
      arrays = assemble_tensor(source, shards, TensorCut{}, read);
      set_rows(arrays, parameter->global_shape[0], parameter->global_shape[1]);
      for (std::vector<float>& array : arrays) {
        array = reshard({array}, TensorCut{}, parameter->global_shape, tensor_cut(*parameter));
      }
    }
    if (arrays[0].size() != parameter->size) {
      throw std::logic_error("checkpoint: " + parameter->name + "'s part holds " + std::to_string(arrays[0].size()) +
                             " elements, the parameter " + std::to_string(parameter->size));
    }
    rank.backend.upload(parameter->value, arrays[0].data(), parameter->size);
    rank.optimizer.import_moment(*parameter, false, 0, arrays[1].data(), parameter->size);
    rank.optimizer.import_moment(*parameter, true, 0, arrays[2].data(), parameter->size);
  }
  for (StageChunk* chunk : rank.chunks) chunk->refresh_compute_weights();

  return state;
}

}  // namespace
}  // namespace checkpoint_format

std::optional<TrainingState> load_checkpoint(const std::string& directory, const CheckpointRank& rank,
                                             CheckpointLoadCounts* counts) {
  try {
    return checkpoint_format::load_latest(directory, rank, counts);
  } catch (const SpecError& failure) {
    if (failure.field() == "--load") throw;
    throw SpecError("--load", failure.what());  // an unreadable file names itself: keep it, under --load
  }
}

}  // namespace megaplan::exec
