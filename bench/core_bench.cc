// Benchmarks of core's hot paths: Megatron rank groups for a large world, plan validation and the
// per-rank parameter and FLOP formulas (run for every candidate layout), and schedule building.
#include <benchmark/benchmark.h>

#include "core/formulas.h"
#include "core/model_presets.h"
#include "core/parallel_plan.h"
#include "core/rank_groups.h"
#include "core/schedule/lowering.h"
#include "core/schedule/validation.h"

namespace {

void BM_RankGroups(benchmark::State& state) {
  const int64_t world = state.range(0);
  for (auto _ : state) {
    benchmark::DoNotOptimize(megaplan::megatron_rank_groups(world, 8, 16, 2, 1));
  }
  state.SetItemsProcessed(state.iterations() * world);
}
BENCHMARK(BM_RankGroups)->Arg(1024)->Arg(16384);

void BM_ValidateAndCountOnePlan(benchmark::State& state) {
  const megaplan::ModelSpec model = megaplan::model_preset("gpt-1t");
  megaplan::ParallelPlan plan;
  plan.tensor_parallel_size = 8;
  plan.pipeline_parallel_size = 64;
  plan.data_parallel_size = 6;
  plan.micro_batch_size = 1;
  plan.global_batch_size = 3072;
  for (auto _ : state) {
    megaplan::validate_plan(model, plan);
    benchmark::DoNotOptimize(megaplan::parameters_per_pipeline_rank(model, plan));
    benchmark::DoNotOptimize(megaplan::hardware_flops(model, plan.global_batch_size,
                                                      megaplan::padded_vocab_size(model, 8),
                                                      megaplan::RecomputeGranularity::kSelective));
  }
}
BENCHMARK(BM_ValidateAndCountOnePlan);

// Issue 3's target: generate + lower + validate an interleaved schedule (pp 64, vpp 4, M 1024) in
// under 50 ms. Arguments: pp, vpp, M.
void BM_GenerateLowerValidate(benchmark::State& state) {
  for (auto _ : state) {
    const megaplan::PipelineSchedule compute = megaplan::generate_schedule(
        megaplan::ScheduleKind::kInterleaved, state.range(0), state.range(1), state.range(2));
    const megaplan::PipelineSchedule lowered = megaplan::lower_schedule(compute);
    megaplan::validate_schedule(lowered);
    benchmark::DoNotOptimize(lowered.ranks.data());
  }
}
BENCHMARK(BM_GenerateLowerValidate)->Args({8, 2, 64})->Args({64, 4, 1024})->Unit(benchmark::kMillisecond);

}  // namespace
