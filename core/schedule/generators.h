// Schedule generators: pure functions of (pipeline size, microbatches, rank) that return one
// pipeline rank's compute actions in order, before lowering adds sends and receives.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/schedule/action.h"

namespace megaplan {

// GPipe: every forward, then every backward, both in microbatch order.
// REQUIRES: pipeline_parallel_size > 0, microbatches > 0, 0 <= rank < pipeline_parallel_size.
std::vector<Action> gpipe_schedule(int64_t pipeline_parallel_size, int64_t microbatches, int64_t rank);

// Megatron-LM's forward_backward_pipelining_without_interleaving: min(pp - rank - 1, M) warm-up
// forwards, then one forward and one backward per step, then the remaining backwards.
// REQUIRES: as gpipe_schedule.
std::vector<Action> one_f_one_b_schedule(int64_t pipeline_parallel_size, int64_t microbatches, int64_t rank);

// Megatron-LM's get_schedule_table: the (microbatch, model chunk) of each virtual microbatch of an
// interleaved schedule. Microbatches go in groups of `group_size`; within a group every chunk
// runs the whole group before the next chunk; the last group may be shorter.
struct VirtualMicrobatch {
  int64_t microbatch;
  int64_t model_chunk;
  bool operator==(const VirtualMicrobatch&) const = default;
};
std::vector<VirtualMicrobatch> interleaved_schedule_table(int64_t microbatches, int64_t model_chunks,
                                                          int64_t group_size);

// Throws SpecError unless Megatron runs this interleaved shape: vpp >= 2, pp >= 2,
// pp <= microbatch group size <= microbatches, and a last group (M % group) that is empty or at
// least pp long. Microbatch rules name `microbatches_field` (the flag that set M: --microbatches,
// or --global-batch-size in a plan).
void validate_interleaved_shape(int64_t pipeline_parallel_size, int64_t virtual_pipeline_size, int64_t microbatches,
                                int64_t group_size, const std::string& microbatches_field);
// The same rules as a predicate that throws nothing, for callers that only filter.
bool interleaved_shape_ok(int64_t pipeline_parallel_size, int64_t virtual_pipeline_size, int64_t microbatches,
                          int64_t group_size);

// Megatron-LM's forward_backward_pipelining_with_interleaving (current, with
// microbatch_group_size_per_vp_stage): (pp - rank - 1) * 2 + (vpp - 1) * group warm-up forwards
// (all of them when that reaches M * vpp), then one forward and one backward per step, then the
// remaining backwards. Forwards walk the schedule table; backwards walk it too with the chunk order
// reversed. Stage of chunk c on rank r: c * pp + r ("loop" placement).
// REQUIRES: validate_interleaved_shape passed.
std::vector<Action> interleaved_schedule(int64_t pipeline_parallel_size, int64_t virtual_pipeline_size,
                                         int64_t microbatches, int64_t group_size, int64_t rank);

// Zero-bubble ZB-H1 (Qi et al.) as torch's ScheduleInterleavedZeroBubble runs it with one stage
// per rank: 1F1B's warm-up of min(pp - rank - 1, M) forwards, then F, I and (after the first
// `rank` steps) the oldest pending W per step, then the remaining I's and W's.
// REQUIRES: as gpipe_schedule.
std::vector<Action> zero_bubble_h1_schedule(int64_t pipeline_parallel_size, int64_t microbatches, int64_t rank);

// torch's ScheduleZBVZeroBubble: two stages per rank in a V (rank r runs stages r and 2pp - 1 - r),
// backwards split into I and W. Laid out for max(M, 2pp - 1) microbatches; work on microbatches
// beyond M is dropped, as torch does. REQUIRES: as gpipe_schedule.
std::vector<Action> zero_bubble_v_schedule(int64_t pipeline_parallel_size, int64_t microbatches, int64_t rank);

// torch's ScheduleDualPipeV (DeepSeek-V3's DualPipe folded into a V): the main phase runs
// OVERLAP_F_B pairs, a forward of one chunk with a full backward of the other.
// REQUIRES: as gpipe_schedule, and microbatches >= 2 * pipeline_parallel_size.
std::vector<Action> dual_pipe_v_schedule(int64_t pipeline_parallel_size, int64_t microbatches, int64_t rank);

}  // namespace megaplan
