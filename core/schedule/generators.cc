// GPipe and Megatron's 1F1B.
#include "core/schedule/generators.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace megaplan {

std::vector<Action> gpipe_schedule(int64_t pipeline_parallel_size, int64_t microbatches, int64_t rank) {
  (void)pipeline_parallel_size;  // every rank runs the same order on its own stage
  std::vector<Action> actions;
  actions.reserve(static_cast<std::size_t>(2 * microbatches));
  for (int64_t microbatch = 0; microbatch < microbatches; ++microbatch) actions.push_back(forward(rank, microbatch));
  for (int64_t microbatch = 0; microbatch < microbatches; ++microbatch) actions.push_back(backward(rank, microbatch));
  return actions;
}

std::vector<Action> one_f_one_b_schedule(int64_t pipeline_parallel_size, int64_t microbatches, int64_t rank) {
  const int64_t warmup = std::min(pipeline_parallel_size - rank - 1, microbatches);
  const int64_t steady = microbatches - warmup;
  // Sized up front and written in place: the planner generates schedules of 10^5 actions often.
  std::vector<Action> actions(static_cast<std::size_t>(2 * microbatches));
  Action* next = actions.data();
  for (int64_t microbatch = 0; microbatch < warmup; ++microbatch) *next++ = forward(rank, microbatch);
  for (int64_t step = 0; step < steady; ++step) {
    *next++ = forward(rank, warmup + step);
    *next++ = backward(rank, step);
  }
  for (int64_t microbatch = steady; microbatch < microbatches; ++microbatch) *next++ = backward(rank, microbatch);
  return actions;
}

std::vector<VirtualMicrobatch> interleaved_schedule_table(int64_t microbatches, int64_t model_chunks,
                                                          int64_t group_size) {
  std::vector<VirtualMicrobatch> table;
  table.reserve(static_cast<std::size_t>(microbatches * model_chunks));
  for (int64_t group_start = 0; group_start < microbatches; group_start += group_size) {
    const int64_t group_end = std::min(group_start + group_size, microbatches);
    for (int64_t chunk = 0; chunk < model_chunks; ++chunk) {
      for (int64_t microbatch = group_start; microbatch < group_end; ++microbatch) table.push_back({microbatch, chunk});
    }
  }
  return table;
}

namespace {

// The first of Megatron's interleaving rules a shape breaks: one list for the predicate and the
// messages, so the planner's cheap check and the error cannot drift apart.
enum class InterleavedRule { kNone, kVirtualStages, kPipeline, kGroupBounds, kFinalGroup };

InterleavedRule broken_interleaved_rule(int64_t pipeline_parallel_size, int64_t virtual_pipeline_size,
                                        int64_t microbatches, int64_t group_size) {
  if (virtual_pipeline_size < 2) return InterleavedRule::kVirtualStages;
  if (pipeline_parallel_size < 2) return InterleavedRule::kPipeline;
  if (group_size < pipeline_parallel_size || group_size > microbatches) return InterleavedRule::kGroupBounds;
  // A last group shorter than pp leaves a chunk waiting on gradients scheduled after it: a hang.
  const int64_t final_group = microbatches % group_size;
  if (final_group > 0 && final_group < pipeline_parallel_size) return InterleavedRule::kFinalGroup;
  return InterleavedRule::kNone;
}

}  // namespace

bool interleaved_shape_ok(int64_t pipeline_parallel_size, int64_t virtual_pipeline_size, int64_t microbatches,
                          int64_t group_size) {
  return broken_interleaved_rule(pipeline_parallel_size, virtual_pipeline_size, microbatches, group_size) ==
         InterleavedRule::kNone;
}

void validate_interleaved_shape(int64_t pipeline_parallel_size, int64_t virtual_pipeline_size, int64_t microbatches,
                                int64_t group_size, const std::string& microbatches_field) {
  const std::string& field = microbatches_field;
  switch (broken_interleaved_rule(pipeline_parallel_size, virtual_pipeline_size, microbatches, group_size)) {
    case InterleavedRule::kNone: return;
    case InterleavedRule::kVirtualStages:
      throw SpecError("--virtual-pipeline-model-parallel-size",
                      "the interleaved schedule needs vpp >= 2, got " + std::to_string(virtual_pipeline_size));
    case InterleavedRule::kPipeline:
      throw SpecError("--pipeline-model-parallel-size",
                      "the interleaved schedule needs pp >= 2, got " + std::to_string(pipeline_parallel_size));
    case InterleavedRule::kGroupBounds:
      throw SpecError(field, "the interleaved schedule needs pp <= microbatch group size <= microbatches; got pp " +
                                 std::to_string(pipeline_parallel_size) + ", group " + std::to_string(group_size) +
                                 ", " + std::to_string(microbatches) + " microbatches");
    case InterleavedRule::kFinalGroup:
      throw SpecError(field, "the interleaved schedule needs microbatches % group size to be 0 or >= pp; got " +
                                 std::to_string(microbatches) + " % " + std::to_string(group_size) + " = " +
                                 std::to_string(microbatches % group_size) + " with pp " +
                                 std::to_string(pipeline_parallel_size));
  }
}

std::vector<Action> interleaved_schedule(int64_t pipeline_parallel_size, int64_t virtual_pipeline_size,
                                         int64_t microbatches, int64_t group_size, int64_t rank) {
  const std::vector<VirtualMicrobatch> table =
      interleaved_schedule_table(microbatches, virtual_pipeline_size, group_size);
  const int64_t total = static_cast<int64_t>(table.size());
  const int64_t warmup =
      std::min((pipeline_parallel_size - rank - 1) * 2 + (virtual_pipeline_size - 1) * group_size, total);
  const auto stage_of_chunk = [&](int64_t chunk) { return chunk * pipeline_parallel_size + rank; };
  const auto forward_of = [&](int64_t k) {
    const VirtualMicrobatch& entry = table[static_cast<std::size_t>(k)];
    return forward(stage_of_chunk(entry.model_chunk), entry.microbatch);
  };
  const auto backward_of = [&](int64_t k) {
    const VirtualMicrobatch& entry = table[static_cast<std::size_t>(k)];
    return backward(stage_of_chunk(virtual_pipeline_size - 1 - entry.model_chunk), entry.microbatch);
  };
  // Sized up front and written in place, as one_f_one_b_schedule.
  std::vector<Action> actions(static_cast<std::size_t>(2 * total));
  Action* next = actions.data();
  for (int64_t k = 0; k < warmup; ++k) *next++ = forward_of(k);
  for (int64_t k = 0; k < total - warmup; ++k) {
    *next++ = forward_of(warmup + k);
    *next++ = backward_of(k);
  }
  for (int64_t k = total - warmup; k < total; ++k) *next++ = backward_of(k);
  return actions;
}

}  // namespace megaplan
