// Schedule shapes and the generator dispatch.
#include "core/schedule/schedule.h"

#include "core/checked_math.h"
#include "core/pipeline_layout.h"
#include "core/schedule/generators.h"

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
  PipelineSchedule schedule;
  schedule.shape.pipeline_parallel_size = pipeline_parallel_size;
  schedule.shape.num_stages = checked_multiply(pipeline_parallel_size, virtual_pipeline_size, "--vpp");
  schedule.shape.microbatches = microbatches;
  schedule.shape.placement = stage_placement(kind);
  const std::string kind_name = to_string(kind);
  const auto require_vpp = [&](int64_t needed, const std::string& why) {
    if (virtual_pipeline_size != needed) {
      throw SpecError("--vpp", kind_name + " " + why + "; needs vpp = " + std::to_string(needed) + ", got " +
                                   std::to_string(virtual_pipeline_size));
    }
  };
  switch (kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::kOneFOneB:
    case ScheduleKind::kZeroBubbleH1:
      require_vpp(1, "runs one stage per rank");
      break;
    case ScheduleKind::kInterleaved:
      if (group_size == 0) group_size = pipeline_parallel_size;
      validate_interleaved_shape(pipeline_parallel_size, virtual_pipeline_size, microbatches, group_size,
                                 "--microbatches");
      break;
    case ScheduleKind::kZeroBubbleV:
      require_vpp(2, "runs two stages per rank in a V");
      break;
    case ScheduleKind::kDualPipeV:
      require_vpp(2, "runs two stages per rank in a V");
      if (microbatches < 2 * pipeline_parallel_size) {
        throw SpecError("--microbatches", "dualpipev needs at least as many microbatches as stages (2 * pp = " +
                                              std::to_string(2 * pipeline_parallel_size) + "), got " +
                                              std::to_string(microbatches));
      }
      break;
  }
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

PipelineSchedule generate_plan_schedule(const ParallelPlan& plan) {
  return generate_schedule(plan.schedule, plan.pipeline_parallel_size, plan.virtual_pipeline_parallel_size,
                           plan.num_microbatches(), plan.pipeline_parallel_size);
}

}  // namespace megaplan
