// Benchmarks of one whole simulation (schedule, lowering, costs, engine, memory) at the scales the
// planner must handle many times: GPT-1T on 3072 A100 (target <= 20 ms) and GPT-3 175B on 8192
// GPUs (target <= 100 ms). Events per second counts the actions simulated but the sends; the
// engine alone, on a schedule lowered and costed once, has its own target: <= 20 ns per event.
#include <benchmark/benchmark.h>

#include "core/cluster_spec.h"
#include "core/model_presets.h"
#include "core/schedule/lowering.h"
#include "simulator/simulate_plan.h"
#include "simulator/stage_costs.h"
#include "simulator/topology.h"

namespace {

megaplan::JobSpec job(const std::string& model, int64_t gpus, int64_t tp, int64_t pp, int64_t gbs) {
  megaplan::JobSpec spec;
  spec.model = megaplan::model_preset(model);
  spec.cluster = megaplan::select_gpus(megaplan::cluster_preset("dgx-a100-80gb"), gpus);
  spec.plan.tensor_parallel_size = tp;
  spec.plan.pipeline_parallel_size = pp;
  spec.plan.data_parallel_size = gpus / (tp * pp);
  spec.plan.micro_batch_size = 1;
  spec.plan.global_batch_size = gbs;
  spec.plan.sequence_parallel = true;
  megaplan::validate_job(spec);
  return spec;
}

void run(benchmark::State& state, const megaplan::JobSpec& spec) {
  const megaplan::sim::Profile profile = megaplan::sim::Profile::datasheet(spec.cluster.gpu);
  int64_t events = 0;
  for (auto _ : state) {
    const megaplan::sim::PlanSimulation simulation = megaplan::sim::simulate_plan(spec, profile, false);
    events += simulation.result.events;
    benchmark::DoNotOptimize(simulation.result.iteration_time_s);
  }
  state.counters["events_per_s"] = benchmark::Counter(static_cast<double>(events), benchmark::Counter::kIsRate);
}

// PTD-P's GPT-1T layout: tp 8, pp 64, mbs 1, gbs 3072 (512 microbatches per replica).
void BM_SimulateGpt1TOn3072(benchmark::State& state) { run(state, job("gpt-1t", 3072, 8, 64, 3072)); }
BENCHMARK(BM_SimulateGpt1TOn3072)->Unit(benchmark::kMillisecond);

// The engine alone on GPT-1T's schedule (lowered and costed outside the loop): ns_per_event.
void BM_EngineGpt1TOn3072(benchmark::State& state) {
  const megaplan::JobSpec spec = job("gpt-1t", 3072, 8, 64, 3072);
  const megaplan::sim::Profile profile = megaplan::sim::Profile::datasheet(spec.cluster.gpu);
  const megaplan::PipelineSchedule lowered = megaplan::lower_schedule(megaplan::generate_plan_schedule(spec.plan));
  megaplan::sim::CostSources sources;
  const megaplan::sim::ActionCosts costs =
      megaplan::sim::plan_action_costs(spec.model, spec.plan, profile, megaplan::sim::Topology(spec.cluster), sources);
  int64_t events = 0;
  for (auto _ : state) {
    const megaplan::sim::SimulationResult result = megaplan::sim::simulate_schedule(lowered, costs, false);
    events += result.events;
    benchmark::DoNotOptimize(result.iteration_time_s);
  }
  state.counters["ns_per_event"] =
      benchmark::Counter(static_cast<double>(events) * 1e-9, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_EngineGpt1TOn3072)->Unit(benchmark::kMillisecond);

// GPT-3 175B on 8192 GPUs: tp 8, pp 16, dp 64, gbs 3072 (48 microbatches per replica).
void BM_SimulateGpt3On8192(benchmark::State& state) { run(state, job("gpt3-175b", 8192, 8, 16, 3072)); }
BENCHMARK(BM_SimulateGpt3On8192)->Unit(benchmark::kMillisecond);

}  // namespace
