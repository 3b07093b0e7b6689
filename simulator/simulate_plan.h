// One plan, end to end: its schedule generated and lowered, every action costed, the engine run,
// memory per pipeline rank, and the headline numbers (Megatron's model TFLOP/s per GPU, MFU).
#pragma once

#include <cstdint>
#include <vector>

#include "core/job_spec.h"
#include "core/memory_model.h"
#include "simulator/engine.h"
#include "simulator/profile.h"
#include "simulator/topology.h"

namespace megaplan::sim {

// An iteration's time as rates: Megatron's model FLOPs and what the GPUs reached.
struct ThroughputRates {
  double model_flops_per_iteration = 0;
  double model_tflops_per_gpu = 0;     // model FLOPs / (iteration time x GPUs) / 1e12
  double hardware_tflops_per_gpu = 0;  // the same with recomputation's FLOPs counted
  double mfu = 0;                      // against the GPU's dense bf16 peak
};
ThroughputRates throughput_rates(const JobSpec& job, double iteration_s);

struct PlanSimulation {
  PipelineSchedule schedule;  // lowered
  SimulationResult result;
  std::vector<PipelineRankMemory> memory;
  CostSources sources;
  ThroughputRates rates;
  int64_t peak_memory_bytes = 0;  // the fullest pipeline rank
  int64_t memory_capacity_bytes = 0;
  bool fits_in_memory = false;
};

// REQUIRES: validate_job(job) passed; profile is for job.cluster.gpu.
PlanSimulation simulate_plan(const JobSpec& job, const Profile& profile, bool record_timeline);
// The same on a topology built once for job.cluster (the planner simulates many plans on it), and
// with `compute` (a compute-only schedule of the plan's shape: an imported CSV,
// read_plan_schedule_csv) costed in place of the plan's generated one.
// REQUIRES: `compute`, where given, lowers to a schedule validate_schedule passes.
PlanSimulation simulate_plan(const JobSpec& job, const Profile& profile, const Topology& topology, bool record_timeline,
                             const PipelineSchedule* compute = nullptr);

// The engine's run alone, on `lowered`, the plan's schedule already lowered: what the planner asks
// of each plan it ranks, sharing one lowering among the plans of a schedule shape.
// REQUIRES: as simulate_plan; `lowered` is lower_schedule of the plan's generated schedule.
SimulationResult simulate_lowered(const JobSpec& job, const Profile& profile, const Topology& topology,
                                  const PipelineSchedule& lowered, bool record_timeline, CostSources& sources);

}  // namespace megaplan::sim
