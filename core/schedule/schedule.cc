// Schedule shapes and the generator dispatch.
#include "core/schedule/schedule.h"

#include "core/checked_math.h"
#include "core/input_limits.h"
#include "core/pipeline_layout.h"
#include "core/schedule/generators.h"
#include "core/schedule/schedule_traits.h"

namespace megaplan {

std::vector<int32_t> rank_of_each_stage(const ScheduleShape& shape) {
  std::vector<int32_t> ranks(static_cast<std::size_t>(shape.num_stages));
  for (std::size_t stage = 0; stage < ranks.size(); ++stage) {
    ranks[stage] = static_cast<int32_t>(shape.rank_of_stage(static_cast<int64_t>(stage)));
  }
  return ranks;
}

PipelineSchedule generate_schedule(ScheduleKind kind, int64_t pipeline_parallel_size, int64_t virtual_pipeline_size,
                                   int64_t microbatches, int64_t group_size) {
  require_positive(pipeline_parallel_size, "--pp");
  require_positive(virtual_pipeline_size, "--vpp");
  require_positive(microbatches, "--microbatches");
  require_at_most(pipeline_parallel_size, kMaxPipelineStages, "--pp");
  require_schedule_size(checked_multiply(pipeline_parallel_size, virtual_pipeline_size, "--vpp"), microbatches, "--vpp",
                        "--microbatches");
  PipelineSchedule schedule;
  schedule.shape.pipeline_parallel_size = pipeline_parallel_size;
  schedule.shape.num_stages = checked_multiply(pipeline_parallel_size, virtual_pipeline_size, "--vpp");
  schedule.shape.microbatches = microbatches;
  schedule.shape.placement = schedule_traits(kind).placement;
  if (group_size == 0) group_size = pipeline_parallel_size;  // Megatron's default; only interleaving reads it
  check_schedule_shape(kind, pipeline_parallel_size, virtual_pipeline_size, microbatches, group_size,
                       ShapeFlags::kGenerator);
  schedule.ranks.reserve(static_cast<std::size_t>(pipeline_parallel_size));
  for (int64_t rank = 0; rank < pipeline_parallel_size; ++rank) {
    switch (kind) {
      case ScheduleKind::kGPipe:
        schedule.ranks.push_back(gpipe_schedule(pipeline_parallel_size, microbatches, rank));
        break;
      case ScheduleKind::kOneFOneB:
        schedule.ranks.push_back(one_f_one_b_schedule(pipeline_parallel_size, microbatches, rank));
        break;
      case ScheduleKind::kInterleaved:
        schedule.ranks.push_back(
            interleaved_schedule(pipeline_parallel_size, virtual_pipeline_size, microbatches, group_size, rank));
        break;
      case ScheduleKind::kZeroBubbleH1:
        schedule.ranks.push_back(zero_bubble_h1_schedule(pipeline_parallel_size, microbatches, rank));
        break;
      case ScheduleKind::kZeroBubbleV:
        schedule.ranks.push_back(zero_bubble_v_schedule(pipeline_parallel_size, microbatches, rank));
        break;
      case ScheduleKind::kDualPipeV:
        schedule.ranks.push_back(dual_pipe_v_schedule(pipeline_parallel_size, microbatches, rank));
        break;
    }
  }
  return schedule;
}

void require_schedule_size(int64_t stages, int64_t microbatches, const std::string& stages_field,
                           const std::string& microbatches_field) {
  require_at_most(stages, kMaxPipelineStages, stages_field + " (pipeline stages)");
  require_at_most(microbatches, kMaxMicrobatches, microbatches_field);
  require_at_most(2 * stages * microbatches, kMaxScheduleActions,
                  microbatches_field + " (2 x " + std::to_string(stages) + " stages x " + std::to_string(microbatches) +
                      " microbatches: forward and backward actions)");
}

PipelineSchedule generate_plan_schedule(const ParallelPlan& plan) {
  return generate_schedule(plan.schedule, plan.pipeline_parallel_size, plan.virtual_pipeline_parallel_size,
                           plan.num_microbatches(), plan.pipeline_parallel_size);
}

}  // namespace megaplan
