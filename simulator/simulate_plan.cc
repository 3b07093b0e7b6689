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

ThroughputRates throughput_rates(const JobSpec& job, double iteration_s) {
  ThroughputRates rates;
  const int64_t vocab = padded_vocab_size(job.model, job.plan.tensor_parallel_size);
  rates.model_flops_per_iteration = model_flops(job.model, job.plan.global_batch_size, vocab);
  if (iteration_s <= 0) return rates;
  const double gpus = static_cast<double>(job.plan.world_size());
  const double per_gpu = rates.model_flops_per_iteration / (iteration_s * gpus);
  rates.model_tflops_per_gpu = per_gpu / 1e12;
  const double hardware = hardware_flops(job.model, job.plan.global_batch_size, vocab, job.plan.recompute_granularity);
  rates.hardware_tflops_per_gpu = hardware / (iteration_s * gpus) / 1e12;
  rates.mfu = per_gpu / job.cluster.gpu.dense_bf16_flops_per_s;
  return rates;
}

SimulationResult simulate_lowered(const JobSpec& job, const Profile& profile, const Topology& topology,
                                  const PipelineSchedule& lowered, bool record_timeline, CostSources& sources) {
  const ActionCosts costs = plan_action_costs(job.model, job.plan, profile, topology, sources);
  return simulate_schedule(lowered, costs, record_timeline);
}

PlanSimulation simulate_plan(const JobSpec& job, const Profile& profile, const Topology& topology, bool record_timeline,
                             const PipelineSchedule* imported) {
  PlanSimulation simulation;
  simulation.schedule = lower_schedule(imported ? *imported : generate_plan_schedule(job.plan));
  simulation.result =
      simulate_lowered(job, profile, topology, simulation.schedule, record_timeline, simulation.sources);
  simulation.memory = memory_per_pipeline_rank(job.model, job.plan, simulation.schedule);
  for (const PipelineRankMemory& rank : simulation.memory) {
    simulation.peak_memory_bytes = std::max(simulation.peak_memory_bytes, rank.total_bytes);
  }
  simulation.memory_capacity_bytes = job.cluster.gpu.hbm_capacity_bytes;
  simulation.fits_in_memory = simulation.peak_memory_bytes <= simulation.memory_capacity_bytes;
  simulation.rates = throughput_rates(job, simulation.result.iteration_time_s);
  return simulation;
}

}  // namespace megaplan::sim
