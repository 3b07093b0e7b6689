// Saves: CheckpointSaver (checkpoint.h), synchronous through a window of a few blocks per thread,
// or with --async-save from a whole image of the rank's directory written by a thread behind the
// training.
#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <thread>
#include <utility>

#include "core/error.h"
#include "core/parameter_list.h"
#include "core/pipeline_layout.h"
#include "core/units.h"
#include "executor/runtime/pinned_host_buffer.h"
#include "executor/train/checkpoint.h"
#include "executor/train/checkpoint_format.h"
#include "executor/train/checkpoint_manifest.h"
#include "executor/train/checkpoint_rank_writer.h"
#include "executor/train/checkpoint_staging.h"
#include "executor/train/checkpoint_state_file.h"

namespace megaplan::exec {

using checkpoint_format::kArraysPerTensor;
using checkpoint_format::kChecksumBlockBytes;
using checkpoint_format::RankFileWriter;
using checkpoint_format::RankLayout;

namespace {

// The share of the host's available memory an --async-save image may take: the rest stays for the
// data, the page cache the writes go through and the other processes of the node.
constexpr double kAsyncImageShareOfAvailable = 0.75;

double elapsed_seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The parameters the rank writes (writes_parameter), in chunk and registration order (the optimizer's).
std::vector<const Parameter*> rank_parameters(const CheckpointRank& rank) {
  std::vector<const Parameter*> parameters;
  for (const StageChunk* chunk : rank.chunks) {
    for (const Parameter& parameter : chunk->parameters()) {
      if (writes_parameter(rank.groups, parameter)) parameters.push_back(&parameter);
    }
  }
  return parameters;
}

// The layout of the rank's directory: its parameters one after the other.
void lay_out_rank(const CheckpointRank& rank, const std::vector<const Parameter*>& parameters, RankLayout& layout) {
  std::vector<checkpoint_format::TensorEntry> entries;
  for (const Parameter* parameter : parameters) entries.push_back(checkpoint_format::entry_of(*parameter));
  layout.lay_out(std::move(entries));
  layout.stages.clear();
  for (const StageChunk* chunk : rank.chunks) layout.stages.push_back(chunk->stage());
  layout.tensor_parallel_rank = rank.groups.tensor_parallel_rank;
  layout.pipeline_rank = rank.groups.pipeline_rank;
}

std::map<const Parameter*, std::size_t> index_of(const std::vector<const Parameter*>& parameters) {
  std::map<const Parameter*, std::size_t> index;
  for (std::size_t i = 0; i < parameters.size(); ++i) index[parameters[i]] = i;
  return index;
}

// Bytes [begin, begin + size) of a tensor (value, then moments, each `elements` floats on the
// device) downloaded to `host`.
void download_part(Backend& backend, const float* const (&arrays)[kArraysPerTensor], std::size_t elements,
                   uint64_t begin, uint64_t size, char* host) {
  checkpoint_format::for_each_array_part(
      elements, begin, size, [&](std::size_t array, uint64_t first, uint64_t count, uint64_t into) {
        backend.download(reinterpret_cast<float*>(host + into), arrays[array] + first, count);
      });
}

// The rank's tensors (values from the parameters, moments from the optimizer, a collective over the
// data-parallel group with the distributed optimizer) downloaded into the laid-out image.
void copy_rank(const CheckpointRank& rank, const std::vector<const Parameter*>& parameters, const RankLayout& layout,
               char* image) {
  const std::map<const Parameter*, std::size_t> index = index_of(parameters);
  rank.optimizer.visit_moments([&](const Parameter& parameter, const float* first, const float* second) {
    const auto found = index.find(&parameter);
    if (found == index.end()) return;  // another replica writes it
    const std::size_t t = found->second;
    const float* const arrays[kArraysPerTensor] = {parameter.value, first, second};
    download_part(rank.backend, arrays, parameter.size, 0, layout.entries[t].bytes(), image + layout.offsets[t]);
  });
}

// The rank's tensors streamed into its directory at `path` through `window` (a whole number of
// blocks): each block downloaded into a free slot, the slots written out whenever all are full.
void stream_rank(const CheckpointRank& rank, const std::vector<const Parameter*>& parameters, const RankLayout& layout,
                 const std::string& path, char* window, std::size_t slots) {
  RankFileWriter writer(path, layout, rank.threads);
  const std::map<const Parameter*, std::size_t> index = index_of(parameters);
  std::size_t used = 0;
  rank.optimizer.visit_moments([&](const Parameter& parameter, const float* first, const float* second) {
    const auto found = index.find(&parameter);
    if (found == index.end()) return;  // another replica writes it
    const std::size_t t = found->second;
    const float* const arrays[kArraysPerTensor] = {parameter.value, first, second};
    for (std::size_t b = 0; b < writer.blocks(t); ++b) {
      if (used == slots) {
        writer.flush();
        used = 0;
      }
      char* slot = window + used++ * kChecksumBlockBytes;
      download_part(rank.backend, arrays, parameter.size, b * kChecksumBlockBytes, writer.block_size(t, b), slot);
      writer.add(t, b, slot);
    }
  });
  writer.commit();
}

// Removes the staging directory of a failed save (on the leader) and rethrows the failure under --save.
[[noreturn]] void fail_save(const std::string& staging, bool leader) {
  std::error_code error;
  if (leader) std::filesystem::remove_all(staging, error);
  try {
    throw;
  } catch (const SpecError& failure) {
    if (failure.field() == "--save") throw;
    throw SpecError("--save", failure.what());  // a staged file's failure names the file: keep it, under --save
  }
}

}  // namespace

// What a save in progress left to do once its files are written: the barrier and the rename.
struct CheckpointSaver::Writing {
  std::string directory, staging;
  int64_t iteration = 0;
  Times times;
  std::thread writer;          // the --async-save writer, while it runs
  std::exception_ptr failure;  // what stopped the writing (set by the writer, read once joined)
};

// The layout of this rank's directory and the page-locked host memory a save goes through (the
// whole image under --async-save, a window of blocks otherwise), kept from one save to the next.
struct CheckpointSaver::Held {
  explicit Held(Backend& backend) : buffer(backend) {}
  RankLayout layout;
  PinnedHostBuffer buffer;
};

CheckpointSaver::CheckpointSaver(bool async, Backend& backend)
    : async_(async), held_(std::make_unique<Held>(backend)) {}

CheckpointSaver::~CheckpointSaver() {
  // A save still being written is left unpublished: its staging directory is never read.
  if (writing_ && writing_->writer.joinable()) writing_->writer.join();
}

std::size_t CheckpointSaver::host_bytes() const { return held_->buffer.bytes(); }

void CheckpointSaver::save(const std::string& directory, const TrainingState& training, const CheckpointRank& rank) {
  (void)finish(rank);
  TrainingState state = training;  // with the expert biases, gathered by every rank
  state.expert_biases = gather_expert_biases(rank.model, rank.chunks, rank.groups.pipeline.get(), rank.backend);
  const ParallelGroups& groups = rank.groups;
  const bool leader = groups.global_rank == 0;  // prepares, renames, writes "latest"
  const std::vector<const Parameter*> parameters = rank_parameters(rank);
  const bool writer = !parameters.empty();  // writes its mp_rank directory
  auto writing = std::make_unique<Writing>();
  writing->directory = directory;
  writing->staging = directory + "/" + checkpoint_format::iteration_directory(state.iteration) + ".tmp";
  writing->iteration = state.iteration;
  const std::string directory_name = checkpoint_format::rank_directory(
      groups.tensor_parallel_rank, groups.pipeline_rank, rank.plan.pipeline_parallel_size, groups.expert_parallel_rank,
      rank.plan.expert_model_parallel_size);
  const std::string path = writing->staging + "/" + directory_name;
  RankLayout& layout = held_->layout;
  const auto start = std::chrono::steady_clock::now();
  try {
    if (leader) (void)checkpoint_format::create_staging(directory, state.iteration);
    if (groups.world) groups.world->barrier();  // the staging directory exists
    if (writer) {
      lay_out_rank(rank, parameters, layout);
      layout.binding = {state.iteration, directory_name, parallel_plan_to_json(rank.plan)};
      if (async_) {
        // Page-locked before the copies, which then run at the bus's speed.
        copy_rank(rank, parameters, layout, held_->buffer.reserve(layout.total_bytes));
      } else {
        std::size_t blocks = 0;
        for (const checkpoint_format::TensorEntry& entry : layout.entries) {
          blocks += checkpoint_format::block_count(entry.bytes(), kChecksumBlockBytes);
        }
        const std::size_t slots = checkpoint_format::window_slots(blocks, rank.threads);
        char* window = held_->buffer.reserve(slots * kChecksumBlockBytes);
        const auto streamed = std::chrono::steady_clock::now();
        writing->times.snapshot_seconds = elapsed_seconds(start);
        stream_rank(rank, parameters, layout, path, window, slots);
        writing->times.write_seconds = elapsed_seconds(streamed);
      }
    } else if (rank.plan.use_distributed_optimizer) {
      // Every data-parallel rank takes part in gathering the moments; the writers keep them.
      rank.optimizer.visit_moments([](const Parameter&, const float*, const float*) {});
    }
    if (leader) {
      write_file_atomically(writing->staging + "/state.json",
                            checkpoint_format::checkpoint_meta(state, rank.model, rank.plan).dump(2) + "\n");
    }
  } catch (...) {
    fail_save(writing->staging, leader);
  }
  Writing& started = *writing;
  started.times.bytes = writer ? layout.total_bytes : 0;
  writing_ = std::move(writing);
  if (!async_) {
    last_snapshot_seconds_ = started.times.snapshot_seconds;
    (void)finish(rank);
    return;
  }
  started.times.snapshot_seconds = last_snapshot_seconds_ = elapsed_seconds(start);
  if (!writer) return;
  const int64_t threads = rank.threads;
  const char* image = held_->buffer.data();
  try {
    started.writer = std::thread([&started, &layout, image, path, threads] {
      const auto written = std::chrono::steady_clock::now();
      try {
        checkpoint_format::write_rank_image(path, layout, image, threads);
      } catch (...) {
        started.failure = std::current_exception();
      }
      started.times.write_seconds = elapsed_seconds(written);
    });
  } catch (...) {
    started.failure = std::current_exception();  // no thread: finish() fails the save
  }
}

std::optional<int64_t> CheckpointSaver::finish(const CheckpointRank& rank) {
  if (!writing_) return std::nullopt;
  if (writing_->writer.joinable()) writing_->writer.join();
  const std::unique_ptr<Writing> writing = std::move(writing_);
  const ParallelGroups& groups = rank.groups;
  const bool leader = groups.global_rank == 0;
  try {
    if (writing->failure) std::rethrow_exception(writing->failure);
    if (groups.world) groups.world->barrier();  // every writer's files are synced
    if (leader) checkpoint_format::publish(writing->directory, writing->staging, writing->iteration);
    if (groups.world) groups.world->barrier();  // the checkpoint is in place for every rank
  } catch (...) {
    fail_save(writing->staging, leader);
  }
  last_save_ = writing->times;
  return writing->iteration;
}

void save_checkpoint(const std::string& directory, const TrainingState& state, const CheckpointRank& rank) {
  CheckpointSaver(false, rank.backend).save(directory, state, rank);
}

uint64_t async_save_image_bytes(const ModelSpec& model, const ParallelPlan& plan, const ParallelGroups& groups) {
  uint64_t bytes = 0;
  for (const int64_t stage : stages_of_pipeline_rank(groups.pipeline_rank, plan)) {
    for (const ParameterSpec& spec :
         describe_parameters(model, plan, stage, groups.tensor_parallel_rank, groups.expert_parallel_rank,
                             groups.expert_tensor_parallel_rank)) {
      if (writes_parameter(groups, spec)) bytes += checkpoint_format::entry_of(spec).bytes();
    }
  }
  return bytes;
}

void check_async_save_memory(uint64_t image_bytes, int64_t available_bytes) {
  const double allowed = kAsyncImageShareOfAvailable * static_cast<double>(available_bytes);
  if (static_cast<double>(image_bytes) <= allowed) return;
  throw SpecError("--async-save", "keeps an image of the rank's checkpoint in host memory, " +
                                      format_gib(static_cast<double>(image_bytes)) +
                                      " (12 bytes per parameter), more than 3/4 of the " +
                                      format_gib(static_cast<double>(available_bytes)) +
                                      " the host has available; save without --async-save (it streams "
                                      "through a few blocks per thread) or on more tensor- or pipeline-parallel ranks");
}

}  // namespace megaplan::exec
