// Schedule shapes and the generator dispatch.
#include "core/schedule/schedule.h"

#include "core/checked_math.h"
#include "core/pipeline_layout.h"
#include "core/schedule/generators.h"

namespace megaplan {

int64_t ScheduleShape::rank_of_stage(int64_t stage) const {
  return pipeline_rank_of_stage(stage, pipeline_parallel_size, placement);
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
  switch (kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::kOneFOneB:
      if (virtual_pipeline_size != 1) {
        throw SpecError("--vpp", kind_name + " runs one stage per rank; needs vpp = 1, got " +
                                     std::to_string(virtual_pipeline_size));
      }
      break;
    case ScheduleKind::kInterleaved:
      if (group_size == 0) group_size = pipeline_parallel_size;
      validate_interleaved_shape(pipeline_parallel_size, virtual_pipeline_size, microbatches, group_size);
      break;
    default:
      throw SpecError("--kind", kind_name + " is not generated yet");
  }
  for (int64_t rank = 0; rank < pipeline_parallel_size; ++rank) {
    switch (kind) {
      case ScheduleKind::kGPipe:
        schedule.ranks.push_back(gpipe_schedule(pipeline_parallel_size, microbatches, rank));
        break;
      case ScheduleKind::kOneFOneB:
        schedule.ranks.push_back(one_f_one_b_schedule(pipeline_parallel_size, microbatches, rank));
        break;
      default:
        schedule.ranks.push_back(
            interleaved_schedule(pipeline_parallel_size, virtual_pipeline_size, microbatches, group_size, rank));
        break;
    }
  }
  return schedule;
}

}  // namespace megaplan
