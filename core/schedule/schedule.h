// PipelineSchedule: every pipeline rank's ordered action list plus the shape it runs on — the value
// the simulator costs and the executor performs.
#pragma once

#include <cstdint>
#include <vector>

#include "core/parallel_plan.h"
#include "core/pipeline_layout.h"
#include "core/schedule/action.h"

namespace megaplan {

struct ScheduleShape {
  int64_t pipeline_parallel_size = 1;
  int64_t num_stages = 1;  // virtual stages: pp * stages per rank
  int64_t microbatches = 1;
  StagePlacement placement = StagePlacement::kLoop;

  int64_t rank_of_stage(int64_t stage) const {
    return pipeline_rank_of_stage(stage, pipeline_parallel_size, placement);
  }
  // rank_of_stage(stage + 1) == rank_of_stage(stage), in closed form for the dependency rule's hot
  // path: consecutive stages share a rank only with one rank, or at the turn of a V (pp-1 and pp).
  bool next_stage_on_same_rank(int64_t stage) const {
    return pipeline_parallel_size == 1 || (placement == StagePlacement::kV && stage == pipeline_parallel_size - 1);
  }
};

// shape.rank_of_stage(s) for every stage s: a table for loops that ask once per action.
std::vector<int32_t> rank_of_each_stage(const ScheduleShape& shape);

struct PipelineSchedule {
  ScheduleShape shape;
  bool lowered = false;                    // sends, receives, REDUCE_GRAD and OPTIM inserted
  std::vector<std::vector<Action>> ranks;  // ranks[r]: pipeline rank r's actions in order
};

// Throws SpecError unless a schedule of `stages` stages and `microbatches` microbatches is one
// megaplan holds (core/input_limits.h), naming `stages_field` or `microbatches_field`.
void require_schedule_size(int64_t stages, int64_t microbatches, const std::string& stages_field,
                           const std::string& microbatches_field);

// Generates the compute-only schedule of `kind` for every rank. `group_size` is Megatron's
// microbatch_group_size_per_vp_stage (interleaved only; 0 means pp).
// Throws SpecError when the shape is not one the schedule supports.
PipelineSchedule generate_schedule(ScheduleKind kind, int64_t pipeline_parallel_size, int64_t virtual_pipeline_size,
                                   int64_t microbatches, int64_t group_size = 0);

// The compute-only schedule a validated plan runs: its kind, pp, vpp and microbatches, with
// Megatron's default microbatch group (pp) for interleaving.
PipelineSchedule generate_plan_schedule(const ParallelPlan& plan);

}  // namespace megaplan
