// Wiring schedule, costs, engine and memory together.
#include "simulator/simulate_plan.h"

#include <algorithm>

#include "core/formulas.h"
#include "core/schedule/lowering.h"
#include "simulator/stage_costs.h"

namespace megaplan::sim {

PlanSimulation simulate_plan(const JobSpec& job, const Profile& profile, bool record_timeline) {
  return simulate_plan(job, profile, Topology(job.cluster), record_timeline);
}

PlanSimulation simulate_plan(const JobSpec& job, const Profile& profile, const Topology& topology, bool record_timeline,
                             const PipelineSchedule* imported) {
  PlanSimulation simulation;
  const PipelineSchedule compute = imported ? *imported : generate_plan_schedule(job.plan);
  simulation.schedule = lower_schedule(compute);
  const ActionCosts costs = plan_action_costs(job.model, job.plan, profile, topology, simulation.sources);
  simulation.result = simulate_schedule(simulation.schedule, costs, record_timeline);

  simulation.memory = memory_per_pipeline_rank(job.model, job.plan, simulation.schedule);
  for (const PipelineRankMemory& rank : simulation.memory) {
    simulation.peak_memory_bytes = std::max(simulation.peak_memory_bytes, rank.total_bytes);
  }
  simulation.memory_capacity_bytes = job.cluster.gpu.hbm_capacity_bytes;
  simulation.fits_in_memory = simulation.peak_memory_bytes <= simulation.memory_capacity_bytes;

  const double gpus = static_cast<double>(job.plan.world_size());
  simulation.model_flops_per_iteration =
      model_flops(job.model, job.plan.global_batch_size, padded_vocab_size(job.model, job.plan.tensor_parallel_size));
  const double seconds = simulation.result.iteration_time_s;
  if (seconds > 0) {
    const double per_gpu = simulation.model_flops_per_iteration / (seconds * gpus);
    simulation.model_tflops_per_gpu = per_gpu / 1e12;
    const double hardware =
        hardware_flops(job.model, job.plan.global_batch_size,
                       padded_vocab_size(job.model, job.plan.tensor_parallel_size), job.plan.recompute_granularity);
    simulation.hardware_tflops_per_gpu = hardware / (seconds * gpus) / 1e12;
    simulation.mfu = per_gpu / job.cluster.gpu.dense_bf16_flops_per_s;
  }
  return simulation;
}

}  // namespace megaplan::sim
