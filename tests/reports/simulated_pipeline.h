// A small simulated pipeline for the trace and comparison tests: 1F1B over 2 ranks, every
// computation 1 ms, every transfer 0.1 ms, every optimizer step 0.1 ms.
#pragma once

#include <cstdint>

#include "core/schedule/lowering.h"
#include "simulator/engine.h"

namespace megaplan::test {

struct SimulatedPipeline {
  PipelineSchedule schedule;
  sim::SimulationResult result;
};

inline SimulatedPipeline simulated_1f1b(int64_t microbatches) {
  SimulatedPipeline pipeline;
  pipeline.schedule = lower_schedule(generate_schedule(ScheduleKind::kOneFOneB, 2, 1, microbatches));
  sim::ActionCosts costs;
  costs.stages.assign(2, {});
  for (auto& stage : costs.stages) {
    stage.forward = 1e-3;
    stage.backward = 2e-3;
    stage.backward_input = 1e-3;
    stage.backward_weight = 1e-3;
    stage.send_forward = stage.send_backward = 1e-4;
  }
  costs.optimizer = {1e-4, 1e-4};
  pipeline.result = sim::simulate_schedule(pipeline.schedule, costs, true);
  return pipeline;
}

}  // namespace megaplan::test
