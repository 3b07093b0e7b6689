// The planner against brute force: enumeration equals every plan validate_plan accepts (less the
// documented duplicates), and the search's ranking equals simulating every plan that fits.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <tuple>
#include <utility>

#include "core/cluster_spec.h"
#include "core/error.h"
#include "core/executor_support.h"
#include "core/memory_model.h"
#include "core/model_presets.h"
#include "core/schedule/schedule.h"
#include "planner/megatron_arguments.h"
#include "planner/search.h"
#include "planner/search_space.h"
#include "simulator/plan_estimator.h"

using Catch::Matchers::Contains;
using megaplan::ParallelPlan;
using megaplan::planner::SearchProblem;

namespace {

SearchProblem small_problem() {
  SearchProblem problem;
  problem.model = megaplan::model_preset("gpt2-350m");  // 24 layers, 16 heads
  problem.gpus = 8;
  problem.gpus_per_node = 8;
  problem.global_batch_size = 16;
  return problem;
}

megaplan::ClusterSpec eight_a100() { return megaplan::select_gpus(megaplan::cluster_preset("dgx-a100-80gb"), 8); }

// A slice of the space that keeps brute force quick: pp <= 2, no context parallelism.
std::vector<ParallelPlan> small_slice(const SearchProblem& problem) {
  std::vector<ParallelPlan> candidates = megaplan::planner::enumerate_plans(problem);
  candidates.erase(
      std::remove_if(candidates.begin(), candidates.end(),
                     [](const ParallelPlan& p) { return p.pipeline_parallel_size > 2 || p.context_parallel_size > 1; }),
      candidates.end());
  return candidates;
}

auto key(const ParallelPlan& p) {
  return std::tuple(p.tensor_parallel_size, p.pipeline_parallel_size, p.context_parallel_size, p.data_parallel_size,
                    p.virtual_pipeline_parallel_size, p.micro_batch_size, p.recompute_granularity, p.sequence_parallel,
                    p.use_distributed_optimizer, p.schedule);
}

}  // namespace

TEST_CASE("enumeration lists exactly the legal plans, less the documented duplicates", "[planner]") {
  const SearchProblem problem = small_problem();
  const std::vector<ParallelPlan> plans = megaplan::planner::enumerate_plans(problem);
  REQUIRE(!plans.empty());
  // Brute force over a box that holds every dimension's legal values.
  std::vector<ParallelPlan> expected;
  using megaplan::RecomputeGranularity;
  using megaplan::ScheduleKind;
  for (int64_t tp : {1, 2, 4, 8}) {
    for (int64_t pp : {1, 2, 4, 8}) {
      for (int64_t cp : {1, 2, 4, 8}) {
        if (8 % (tp * pp * cp) != 0) continue;
        for (int64_t vpp = 1; vpp <= 24; ++vpp) {
          for (int64_t mbs = 1; mbs <= 16; ++mbs) {
            for (auto recompute :
                 {RecomputeGranularity::kNone, RecomputeGranularity::kSelective, RecomputeGranularity::kFull}) {
              for (bool sp : {false, true}) {
                for (bool distributed : {false, true}) {
                  for (auto schedule :
                       {ScheduleKind::kOneFOneB, ScheduleKind::kInterleaved, ScheduleKind::kZeroBubbleH1,
                        ScheduleKind::kZeroBubbleV, ScheduleKind::kDualPipeV}) {
                    ParallelPlan plan{tp, pp, cp,          8 / (tp * pp * cp), vpp,     mbs,
                                      16, sp, distributed, recompute,          schedule};
                    try {
                      megaplan::validate_plan(problem.model, plan);
                    } catch (const megaplan::SpecError&) {
                      continue;
                    }
                    if (pp == 1 && schedule != ScheduleKind::kOneFOneB) continue;    // degenerate to 1f1b
                    if (distributed && plan.data_parallel_size * cp == 1) continue;  // shards over nothing
                    expected.push_back(plan);
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, megaplan::RecomputeGranularity, bool,
                         bool, megaplan::ScheduleKind>>
      got, want;
  for (const ParallelPlan& plan : plans) got.push_back(key(plan));
  for (const ParallelPlan& plan : expected) want.push_back(key(plan));
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  CHECK(got.size() == plans.size());
  CHECK(std::adjacent_find(got.begin(), got.end()) == got.end());
  CHECK(got == want);
  // Context parallelism among them (megaplan's executor runs it, the simulator costs its ring).
  CHECK(std::any_of(plans.begin(), plans.end(), [](const ParallelPlan& p) { return p.context_parallel_size > 1; }));
  // Validated on threads, the same list in the same order.
  for (const int64_t threads : {2, 3}) {
    const std::vector<ParallelPlan> threaded = megaplan::planner::enumerate_plans(problem, threads);
    REQUIRE(threaded.size() == plans.size());
    for (std::size_t i = 0; i < plans.size(); ++i) CHECK(key(threaded[i]) == key(plans[i]));
  }
}

TEST_CASE("pins and lists narrow the enumeration", "[planner]") {
  SearchProblem problem = small_problem();
  problem.space.tensor_parallel = {2};
  problem.space.pipeline_parallel = {1, 4};
  problem.space.recompute = {megaplan::RecomputeGranularity::kFull};
  problem.space.sequence_parallel = {true};
  const std::vector<ParallelPlan> plans = megaplan::planner::enumerate_plans(problem);
  REQUIRE(!plans.empty());
  for (const ParallelPlan& plan : plans) {
    CHECK(plan.tensor_parallel_size == 2);
    CHECK((plan.pipeline_parallel_size == 1 || plan.pipeline_parallel_size == 4));
    CHECK(plan.recompute_granularity == megaplan::RecomputeGranularity::kFull);
    CHECK(plan.sequence_parallel);
  }
  problem.space = {};
  problem.space.layers_per_virtual_stage = {3};
  for (const ParallelPlan& plan : megaplan::planner::enumerate_plans(problem)) {
    CHECK(plan.virtual_pipeline_parallel_size > 1);
    CHECK(24 / plan.num_virtual_stages() == 3);
  }
}

TEST_CASE("contradictory pins and impossible batches are refused naming the flag", "[planner]") {
  SearchProblem problem = small_problem();
  problem.space.tensor_parallel = {3};
  CHECK_THROWS_WITH(megaplan::planner::validate_search_problem(problem),
                    Contains("--tensor-model-parallel-size") && Contains("--num-attention-heads 16"));
  problem = small_problem();
  problem.space.pipeline_parallel = {5};
  CHECK_THROWS_WITH(megaplan::planner::validate_search_problem(problem), Contains("--pipeline-model-parallel-size"));
  problem = small_problem();
  problem.space.tensor_parallel = {8};
  problem.global_batch_size = 7;
  // Only dp 1 remains with tp 8; 7 is divisible by it, so this is fine...
  CHECK_NOTHROW(megaplan::planner::validate_search_problem(problem));
  problem.space.tensor_parallel = {1};
  problem.space.pipeline_parallel = {1};
  problem.space.context_parallel = {1};
  // ...but with dp 8 it is not.
  CHECK_THROWS_WITH(megaplan::planner::validate_search_problem(problem),
                    Contains("--global-batch-size") && Contains("(8)"));
}

TEST_CASE("the search ranks exactly as simulating every plan that fits", "[planner]") {
  const SearchProblem problem = small_problem();
  const megaplan::ClusterSpec cluster = eight_a100();
  const megaplan::sim::SimulatorEstimator estimator(problem.model, cluster,
                                                    megaplan::sim::Profile::datasheet(cluster.gpu));
  const std::vector<ParallelPlan> candidates = small_slice(problem);
  REQUIRE(candidates.size() > 50);
  megaplan::planner::SearchOptions options;
  options.top = 7;
  options.memory_fraction = 0.9;
  options.threads = 1;
  const megaplan::planner::SearchResult result =
      megaplan::planner::search_plans(problem.model, cluster.gpu, candidates, estimator, options);

  struct Timed {
    double time;
    std::size_t index;
  };
  std::vector<Timed> all;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    int64_t peak = 0;
    for (const auto& rank : megaplan::memory_per_pipeline_rank(problem.model, candidates[i],
                                                               megaplan::generate_plan_schedule(candidates[i]))) {
      peak = std::max(peak, rank.total_bytes);
    }
    if (peak > result.memory_limit_bytes) continue;
    all.push_back({estimator.estimate(candidates[i]).iteration_time_s, i});
  }
  std::sort(all.begin(), all.end(),
            [](const Timed& a, const Timed& b) { return a.time != b.time ? a.time < b.time : a.index < b.index; });
  REQUIRE(result.plans.size() == 7);
  for (std::size_t rank = 0; rank < 7; ++rank) {
    CHECK(key(result.plans[rank].plan) == key(candidates[all[rank].index]));
    CHECK(result.plans[rank].estimate.iteration_time_s == all[rank].time);
  }
  const megaplan::planner::SearchCounts& counts = result.counts;
  CHECK(counts.enumerated == static_cast<int64_t>(candidates.size()));
  CHECK(counts.pruned_model_state + counts.pruned_activations + counts.pruned_by_bound + counts.simulated ==
        counts.enumerated);
  CHECK(counts.simulated < static_cast<int64_t>(all.size()));  // the bound spared some simulations

  options.threads = 2;
  const megaplan::planner::SearchResult threaded =
      megaplan::planner::search_plans(problem.model, cluster.gpu, candidates, estimator, options);
  REQUIRE(threaded.plans.size() == result.plans.size());
  for (std::size_t rank = 0; rank < result.plans.size(); ++rank) {
    CHECK(key(threaded.plans[rank].plan) == key(result.plans[rank].plan));
  }

  // No tolerance, no ties; with one, exactly the plans predicted within it of the best.
  for (const megaplan::RankedPlan& ranked : result.plans) CHECK_FALSE(ranked.tie);
  const double best = result.plans.front().estimate.iteration_time_s;
  options.tie_tolerance = (result.plans[3].estimate.iteration_time_s / best - 1) * 1.000001;
  const megaplan::planner::SearchResult tied =
      megaplan::planner::search_plans(problem.model, cluster.gpu, candidates, estimator, options);
  CHECK_FALSE(tied.plans[0].tie);  // the best is not a tie with itself
  for (std::size_t rank = 1; rank < tied.plans.size(); ++rank) {
    INFO("#" << rank + 1);
    CHECK(tied.plans[rank].tie ==
          (tied.plans[rank].estimate.iteration_time_s <= tied.plans[3].estimate.iteration_time_s));
  }
  CHECK(tied.plans[3].tie);
}

TEST_CASE("faster layouts refused on memory are costed and listed, whatever the thread count", "[planner]") {
  const SearchProblem problem = small_problem();
  const megaplan::ClusterSpec cluster = eight_a100();
  const megaplan::sim::SimulatorEstimator estimator(problem.model, cluster,
                                                    megaplan::sim::Profile::datasheet(cluster.gpu));
  const std::vector<ParallelPlan> candidates = small_slice(problem);
  megaplan::planner::SearchOptions options;
  options.top = 3;
  options.memory_fraction = 0.05;  // 4 GB: the fastest layouts no longer fit
  options.threads = 1;
  const megaplan::planner::SearchResult result =
      megaplan::planner::search_plans(problem.model, cluster.gpu, candidates, estimator, options);
  REQUIRE_FALSE(result.plans.empty());
  const double best = result.plans.front().estimate.iteration_time_s;
  REQUIRE_FALSE(result.over_memory.empty());
  CHECK(result.over_memory.size() <= 3);
  for (std::size_t i = 0; i < result.over_memory.size(); ++i) {
    const megaplan::RankedPlan& over = result.over_memory[i];
    CHECK(over.peak_memory_bytes > result.memory_limit_bytes);
    CHECK(over.estimate.iteration_time_s < best);
    CHECK(over.estimate.iteration_time_s == estimator.estimate(over.plan).iteration_time_s);
    if (i > 0) CHECK(over.estimate.iteration_time_s >= result.over_memory[i - 1].estimate.iteration_time_s);
  }
  // More threads than the list needs take estimates ahead; the list stays the one thread's.
  for (const int64_t threads : {2, 4, 8}) {
    options.threads = threads;
    const megaplan::planner::SearchResult threaded =
        megaplan::planner::search_plans(problem.model, cluster.gpu, candidates, estimator, options);
    REQUIRE(threaded.over_memory.size() == result.over_memory.size());
    for (std::size_t i = 0; i < result.over_memory.size(); ++i) {
      CHECK(key(threaded.over_memory[i].plan) == key(result.over_memory[i].plan));
    }
  }
}

TEST_CASE("a request nothing fits names the closest plan and its shortfall", "[planner]") {
  SearchProblem problem;
  problem.model = megaplan::model_preset("gpt3-175b");
  problem.gpus = 8;
  problem.gpus_per_node = 8;
  problem.global_batch_size = 8;
  problem.space.context_parallel = {1};
  const megaplan::ClusterSpec cluster = eight_a100();
  const megaplan::sim::SimulatorEstimator estimator(problem.model, cluster,
                                                    megaplan::sim::Profile::datasheet(cluster.gpu));
  const std::vector<ParallelPlan> candidates = megaplan::planner::enumerate_plans(problem);
  megaplan::planner::SearchOptions options;
  options.threads = 1;
  // 175 B parameters at 6 + 12/dp bytes each over 8 GPUs is far beyond 72 GB: the closest plan
  // shards everything (tp x pp = 8, distributed optimizer).
  CHECK_THROWS_WITH(
      megaplan::planner::search_plans(problem.model, cluster.gpu, candidates, estimator, options),
      Contains("--memory-fraction: no layout fits in 67.06 GiB per GPU (90% of 74.51 GiB); the closest") &&
          Contains("GiB more"));
}

TEST_CASE("searching a problem equals searching every plan it enumerates", "[planner]") {
  // gpt2-350m on 8 GPUs at 5% of an A100 (4 GB): most plans are over on model state alone, some fit,
  // some are refused on activations and listed as faster; at 0.5% none fits.
  SearchProblem problem = small_problem();
  problem.space.pipeline_parallel = {1, 2, 4};
  problem.space.context_parallel = {1};
  const megaplan::ClusterSpec cluster = eight_a100();
  const megaplan::sim::SimulatorEstimator estimator(problem.model, cluster,
                                                    megaplan::sim::Profile::datasheet(cluster.gpu));
  megaplan::planner::SearchOptions options;
  options.top = 4;
  options.memory_fraction = 0.05;
  for (const int64_t threads : {1, 2}) {
    INFO(threads << " threads");
    options.threads = threads;
    const megaplan::planner::SearchResult every = megaplan::planner::search_plans(
        problem.model, cluster.gpu, megaplan::planner::enumerate_plans(problem), estimator, options);
    const megaplan::planner::SearchResult searched =
        megaplan::planner::search_problem(problem, cluster.gpu, estimator, options);
    REQUIRE(every.counts.pruned_model_state > 0);
    REQUIRE_FALSE(every.over_memory.empty());
    CHECK(searched.counts.enumerated == every.counts.enumerated);
    CHECK(searched.counts.pruned_model_state == every.counts.pruned_model_state);
    CHECK(searched.counts.pruned_activations + searched.counts.pruned_by_bound + searched.counts.simulated ==
          every.counts.pruned_activations + every.counts.pruned_by_bound + every.counts.simulated);
    for (const auto& [got, want] :
         {std::pair(&searched.plans, &every.plans), std::pair(&searched.over_memory, &every.over_memory)}) {
      REQUIRE(got->size() == want->size());
      for (std::size_t i = 0; i < got->size(); ++i) {
        CHECK(key((*got)[i].plan) == key((*want)[i].plan));
        CHECK((*got)[i].estimate.iteration_time_s == (*want)[i].estimate.iteration_time_s);
        CHECK((*got)[i].peak_memory_bytes == (*want)[i].peak_memory_bytes);
      }
    }
  }
  options.memory_fraction = 0.005;
  std::string every_error, searched_error;
  try {
    megaplan::planner::search_plans(problem.model, cluster.gpu, megaplan::planner::enumerate_plans(problem), estimator,
                                    options);
  } catch (const megaplan::SpecError& error) {
    every_error = error.what();
  }
  try {
    megaplan::planner::search_problem(problem, cluster.gpu, estimator, options);
  } catch (const megaplan::SpecError& error) {
    searched_error = error.what();
  }
  CHECK_THAT(every_error, Contains("the closest"));
  CHECK(searched_error == every_error);
}

TEST_CASE("Megatron-LM arguments for a plan", "[planner]") {
  const megaplan::ModelSpec model = megaplan::model_preset("gpt3-175b");
  ParallelPlan plan;
  plan.tensor_parallel_size = 8;
  plan.pipeline_parallel_size = 8;
  plan.virtual_pipeline_parallel_size = 3;
  plan.data_parallel_size = 16;
  plan.micro_batch_size = 1;
  plan.global_batch_size = 1536;
  plan.sequence_parallel = true;
  plan.use_distributed_optimizer = true;
  plan.recompute_granularity = megaplan::RecomputeGranularity::kSelective;
  plan.schedule = megaplan::ScheduleKind::kInterleaved;
  const std::vector<std::string> arguments = megaplan::planner::megatron_arguments(model, plan);
  CHECK(arguments ==
        std::vector<std::string>{"--num-layers 96",
                                 "--hidden-size 12288",
                                 "--ffn-hidden-size 49152",
                                 "--num-attention-heads 96",
                                 "--seq-length 2048",
                                 "--max-position-embeddings 2048",
                                 "--position-embedding-type learned_absolute",
                                 "--normalization LayerNorm",
                                 "--norm-epsilon 1e-05",
                                 "--tensor-model-parallel-size 8",
                                 "--pipeline-model-parallel-size 8",
                                 "--num-layers-per-virtual-pipeline-stage 4",
                                 "--micro-batch-size 1",
                                 "--global-batch-size 1536",
                                 "--sequence-parallel",
                                 "--use-distributed-optimizer",
                                 "--overlap-grad-reduce",
                                 "--bf16",
                                 "--transformer-impl local",
                                 "--use-flash-attn",
                                 "--attention-dropout 0",
                                 "--hidden-dropout 0",
                                 "--recompute-granularity selective",
                                 "# the vocabulary (50257 tokens) comes from your --tokenizer-type and its "
                                 "files; with --tokenizer-type NullTokenizer: --vocab-size 50257"});
  // Megatron's own implementations: what the simulation assumed, in Megatron's flags.
  plan.implementation = megaplan::Implementation::kMegatronLocal;
  plan.options = megaplan::default_implementation_options(plan.implementation);
  const std::vector<std::string> local = megaplan::planner::megatron_arguments(model, plan);
  for (const char* flag : {"--fp16", "--transformer-impl local", "--attention-dropout 0.1", "--hidden-dropout 0.1",
                           "--no-masked-softmax-fusion", "--no-gradient-accumulation-fusion"}) {
    CHECK(std::find(local.begin(), local.end(), flag) != local.end());
  }
  CHECK(std::find(local.begin(), local.end(), "--overlap-grad-reduce") == local.end());
  plan.implementation = megaplan::Implementation::kMegatronCore;
  plan.options = megaplan::default_implementation_options(plan.implementation);
  const std::vector<std::string> core = megaplan::planner::megatron_arguments(model, plan);
  for (const char* flag :
       {"--bf16", "--transformer-impl transformer_engine", "--overlap-param-gather", "--tp-comm-overlap"}) {
    CHECK(std::find(core.begin(), core.end(), flag) != core.end());
  }
  plan.implementation = megaplan::Implementation::kMegaplan;
  plan.options = megaplan::default_implementation_options(plan.implementation);
  plan.virtual_pipeline_parallel_size = 2;
  plan.schedule = megaplan::ScheduleKind::kZeroBubbleV;
  plan.recompute_granularity = megaplan::RecomputeGranularity::kFull;
  const std::vector<std::string> v = megaplan::planner::megatron_arguments(model, plan);
  CHECK(std::find(v.begin(), v.end(), "--recompute-method uniform") != v.end());
  CHECK_THAT(v.back(), Contains("ZBVZeroBubble"));
  // Context parallelism: Megatron-Core's ring over send and receive, in Transformer Engine.
  plan.schedule = megaplan::ScheduleKind::kOneFOneB;
  plan.virtual_pipeline_parallel_size = 1;
  plan.context_parallel_size = 2;
  plan.data_parallel_size = 8;
  const std::vector<std::string> ring = megaplan::planner::megatron_arguments(model, plan);
  for (const char* flag :
       {"--context-parallel-size 2", "--cp-comm-type p2p", "--transformer-impl transformer_engine"}) {
    CHECK(std::find(ring.begin(), ring.end(), flag) != ring.end());
  }
  CHECK(std::find(ring.begin(), ring.end(), "--use-flash-attn") == ring.end());
}

TEST_CASE("the simulator's lower bound never exceeds its estimate", "[planner][simulator]") {
  SearchProblem problem = small_problem();
  problem.global_batch_size = 32;
  using megaplan::ScheduleKind;
  problem.space.schedules = {ScheduleKind::kGPipe,        ScheduleKind::kOneFOneB,    ScheduleKind::kInterleaved,
                             ScheduleKind::kZeroBubbleH1, ScheduleKind::kZeroBubbleV, ScheduleKind::kDualPipeV};
  const megaplan::ClusterSpec cluster = eight_a100();
  const megaplan::sim::SimulatorEstimator estimator(problem.model, cluster,
                                                    megaplan::sim::Profile::datasheet(cluster.gpu));
  int64_t checked = 0;
  std::vector<megaplan::ScheduleKind> kinds_seen;
  for (const ParallelPlan& plan : megaplan::planner::enumerate_plans(problem)) {
    // Every schedule kind and shape, on one recompute and optimizer setting to keep it quick.
    if (plan.recompute_granularity != megaplan::RecomputeGranularity::kSelective || plan.use_distributed_optimizer)
      continue;
    const double bound = estimator.lower_bound_s(plan);
    const double time = estimator.estimate(plan).iteration_time_s;
    INFO(megaplan::describe_plan(plan) << ": bound " << bound << " s, simulated " << time << " s");
    CHECK(bound > 0);
    CHECK(bound <= time);
    if (std::find(kinds_seen.begin(), kinds_seen.end(), plan.schedule) == kinds_seen.end())
      kinds_seen.push_back(plan.schedule);
    ++checked;
  }
  CHECK(checked > 100);
  CHECK(kinds_seen.size() == 6);
}
