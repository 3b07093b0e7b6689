// The step-time estimator: what the planner asks of a cost model, declared here so that planner/
// ranks layouts without knowing the simulator (docs/architecture.md: they meet in core, cli wires them).
#pragma once

#include <cstdint>

#include "core/parallel_plan.h"
#include "core/schedule/schedule.h"

namespace megaplan {

// One plan's estimated iteration, with the terms `search --explain` compares. The terms are means
// over pipeline ranks of where each rank's iteration went; they add up to iteration_time_s.
struct StepEstimate {
  double iteration_time_s = 0;
  double model_tflops_per_gpu = 0;  // Megatron's model FLOPs / (iteration time x GPUs) / 1e12
  double mfu = 0;                   // against the GPU's dense bf16 peak
  double bubble_fraction = 0;
  double compute_s = 0;             // computing (tensor- and context-parallel collectives excluded)
  double tensor_comm_s = 0;         // tensor- and context-parallel collectives inside layers
  double pipeline_comm_s = 0;       // exposed point-to-point transfers between stages
  double data_parallel_comm_s = 0;  // exposed gradient reduction (and the distributed optimizer's gather)
  double idle_s = 0;                // waiting on other stages: the bubble and the tail
};

// A plan and what the estimator (and the memory model) said of it: a row of the planner's ranking.
struct RankedPlan {
  ParallelPlan plan;
  StepEstimate estimate;
  int64_t peak_memory_bytes = 0;  // the fullest pipeline rank, by core's memory model
  double lower_bound_s = 0;
  bool tie = false;  // within tie_tolerance of the best: the estimate cannot tell the two apart
};

// Every function is safe to call from several threads at once.
class StepTimeEstimator {
 public:
  virtual ~StepTimeEstimator() = default;
  // A time that estimate(plan).iteration_time_s is never below, cheap enough to compute for
  // every candidate: the planner skips plans whose bound cannot beat its current k-th best.
  // REQUIRES: validate_plan(model, plan) passed for the estimator's model, on its GPUs.
  virtual double lower_bound_s(const ParallelPlan& plan) const = 0;
  // `lowered`: the plan's generated schedule, lowered
  // (the planner lowers each schedule shape once and shares it among the plans of that shape).
  virtual StepEstimate estimate(const ParallelPlan& plan, const PipelineSchedule& lowered) const = 0;
  // The same, lowering the plan's schedule first.
  StepEstimate estimate(const ParallelPlan& plan) const;
};

}  // namespace megaplan
