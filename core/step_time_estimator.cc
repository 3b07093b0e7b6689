#include "core/step_time_estimator.h"

#include "core/schedule/lowering.h"

namespace megaplan {

StepEstimate StepTimeEstimator::estimate(const ParallelPlan& plan) const {
  return estimate(plan, lower_schedule(generate_plan_schedule(plan)));
}

}  // namespace megaplan
