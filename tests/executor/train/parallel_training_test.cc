// Every parallel layout trains like one rank: a 4-layer GPT on the CPU backend, ranks as threads of
// one process on the in-process communicators, 12 iterations of the same global batches. Each
// layout must log the single-rank run's losses and end on its weights and gradient norm.
//
// Tolerance: the layouts compute the same sums in a different order (a pipeline adds no
// arithmetic, but data parallelism adds the replicas' gradients after each replica summed its own
// microbatches, the distributed optimizer's norm adds shard by shard, and tensor parallelism sums
// row-parallel GEMMs' partial products and sequence-parallel norm gradients across ranks). In fp32 that moves
// results by a few ulps (~1e-7 relative) per step. AdamW then divides each gradient by its own
// sqrt(v): an element whose gradient is near zero can turn an ulp of difference into a step of up
// to lr (3e-3, against weights of at most ~0.05), so weights drift further than losses. Measured:
// pipelines are exact, data parallelism moves losses by < 1e-5 relative and a weight tensor by at
// most 2.5e-4 of its largest value. We allow 1e-4 relative on losses and the gradient norm and
// 1e-3 of the tensor's largest value on weights; a wrong microbatch, a missing or doubled gradient
// or a stale weight moves losses by 1e-2 or more.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/batch_rampup.h"
#include "core/error.h"
#include "core/parallel_plan.h"
#include "core/schedule/lowering.h"
#include "core/schedule/schedule.h"
#include "core/schedule/schedule_csv.h"
#include "core/text_file.h"
#include "core/timeline.h"
#include "executor/comm/in_process_comm.h"
#include "executor/comm/rank_threads.h"
#include "executor/runtime/cpu_backend.h"
#include "executor/train/parallel_groups.h"
#include "executor/train/trainer.h"
#include "tests/executor/train/training_fixtures.h"
#include "tests/executor/train/training_run.h"

namespace {

using megaplan::ParallelPlan;
using megaplan::ScheduleKind;
namespace exec = megaplan::exec;

using megaplan::test::four_layer_gpt;

exec::TrainOptions options_for(const std::string& corpus) {
  exec::TrainOptions options;
  options.train_iters = 12;
  options.learning_rate.max_lr = 3e-3;
  options.learning_rate.warmup_iterations = 2;
  options.log_interval = 1;
  options.eval_interval = 6;
  options.eval_iters = 1;
  options.split = "9,1,0";
  options.data_path = corpus;
  options.keep_final_weights = true;
  options.distributed_timeout_minutes = 2;
  return options;
}

struct Layout {
  std::string name;
  ParallelPlan plan;
};

ParallelPlan plan_of(int64_t tp, int64_t pp, int64_t dp, int64_t vpp, ScheduleKind schedule) {
  return megaplan::test::layout(tp, pp, dp, vpp, schedule);
}

using megaplan::test::Outcome;

Outcome train(const megaplan::ModelSpec& model, const ParallelPlan& plan, const exec::TrainOptions& options,
              const megaplan::test::ScratchDirectory& scratch, const std::string& name) {
  return megaplan::test::train_logged(
      model, plan, options, scratch, name,
      [](int64_t) -> std::unique_ptr<exec::Backend> { return std::make_unique<exec::CpuBackend>(); });
}

// Each pipeline rank's slices of `timeline` are its lowered list's actions, in order, each on the
// action kind's stream, one after another on that rank's clock (the CPU's work is synchronous).
void check_follows_lowered_lists(const megaplan::Timeline& timeline, const ParallelPlan& plan) {
  const megaplan::PipelineSchedule schedule = megaplan::lower_schedule(megaplan::generate_plan_schedule(plan));
  for (std::size_t rank = 0; rank < schedule.ranks.size(); ++rank) {
    INFO("pipeline rank " << rank);
    std::vector<megaplan::Action> recorded;
    double previous_end = 0;
    for (const megaplan::TimelineSlice& slice : timeline.slices) {
      if (slice.pipeline_rank != static_cast<int32_t>(rank)) continue;
      recorded.push_back(slice.action);
      CHECK(slice.stream == megaplan::stream_of(slice.action.kind));
      CHECK(slice.start_s >= previous_end);
      CHECK(slice.end_s >= slice.start_s);
      previous_end = slice.end_s;
    }
    CHECK(recorded == schedule.ranks[rank]);
  }
}

double largest_magnitude(const std::vector<float>& values) {
  double largest = 0;
  for (const float v : values) largest = std::max(largest, static_cast<double>(std::abs(v)));
  return largest;
}

// Each layout logs `single`'s losses, ends on its gradient norm and its weights (tolerances above).
// `prefix` names the runs' logs in `scratch`.
void check_trains_like(const Outcome& single, const megaplan::ModelSpec& model, const std::vector<Layout>& layouts,
                       const exec::TrainOptions& options, const megaplan::test::ScratchDirectory& scratch,
                       const std::string& prefix = "") {
  for (std::size_t l = 0; l < layouts.size(); ++l) {
    const Layout& layout = layouts[l];
    INFO(layout.name);
    const Outcome run = train(model, layout.plan, options, scratch, prefix + "layout" + std::to_string(l));
    REQUIRE(run.losses.size() == single.losses.size());
    for (std::size_t i = 0; i < single.losses.size(); ++i) {
      INFO("iteration " << i + 1);
      CHECK(run.losses[i] == Approx(single.losses[i]).epsilon(1e-4));
    }
    CHECK(run.summary.last_gradient_norm == Approx(single.summary.last_gradient_norm).epsilon(1e-4));
    // Validation ran through the pipeline too, and agrees.
    CHECK(run.out.find("validation loss at iteration " + std::to_string(single.losses.size())) != std::string::npos);
    REQUIRE(single.summary.final_weights.size() > 20);
    for (const auto& [name, expected] : single.summary.final_weights) {
      INFO(name);
      const auto found = run.summary.final_weights.find(name);
      REQUIRE(found != run.summary.final_weights.end());
      REQUIRE(found->second.size() == expected.size());
      const double scale = std::max(largest_magnitude(expected), 1e-6);
      double worst = 0;
      for (std::size_t i = 0; i < expected.size(); ++i) {
        worst = std::max(worst, std::abs(static_cast<double>(found->second[i]) - expected[i]) / scale);
      }
      CHECK(worst <= 1e-3);
    }
    // The tied output layer's copy on the last pipeline rank stayed equal to the embedding.
    const auto copy = run.summary.final_weights.find("output_layer.weight");
    if (!model.untie_embeddings_and_output_weights && copy != run.summary.final_weights.end()) {
      CHECK(copy->second == run.summary.final_weights.at("embedding.word_embeddings.weight"));
    }
  }
}

// The gradient norms layout `layout` logged are layout `reference`'s, every iteration, within 1e-6
// (closer than check_trains_like's tolerance).
void check_same_gradient_norms(const megaplan::test::ScratchDirectory& scratch, const std::string& prefix,
                               std::size_t reference, std::size_t layout) {
  const auto norms = [&](std::size_t index) {
    return megaplan::test::logged_iteration_values(scratch.file(prefix + "layout" + std::to_string(index) + ".jsonl"),
                                                   "grad_norm");
  };
  const std::vector<double> expected = norms(reference), got = norms(layout);
  REQUIRE(got.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) CHECK(got[i] == Approx(expected[i]).epsilon(1e-6));
}

// The router losses and the experts' load each run of `layouts` logged against the single rank's
// (the runs check_trains_like made under `prefix`).
void check_router_logs(const Outcome& single, const megaplan::ModelSpec& model, const std::vector<Layout>& layouts,
                       const megaplan::test::ScratchDirectory& scratch, const std::string& prefix) {
  // The router losses each run logs, as Megatron logs them (over the MoE layers, microbatches and
  // replicas, without their coefficients), are the single rank's too.
  const bool by_sequence = model.moe.load_balancing == megaplan::LoadBalancing::kSeqAuxLoss;
  std::vector<std::string> keys = {by_sequence ? "seq_load_balancing_loss" : "load_balancing_loss"};
  if (model.moe.z_loss_coeff > 0) {
    keys.emplace_back("z_loss");
  } else {
    CHECK(single.out.find("z_loss") == std::string::npos);  // a loss the run does not apply is not logged
  }
  CHECK(single.out.find(" | " + keys.front() + " ") != std::string::npos);
  // The experts' load, the busiest expert's tokens over the mean of a dispatch: the single rank's
  // where each rank dispatches alone; under expert parallelism the ep group's tokens together.
  const auto load = [&](const std::string& run) {
    return megaplan::test::logged_iteration_values(scratch.file(prefix + run + ".jsonl"), "tokens_per_expert_max_mean");
  };
  const std::vector<double> single_load = load("single");
  REQUIRE(single_load.size() == 12);
  // Each MoE layer's in the log file too (Megatron's per-layer logging): their mean is the above.
  std::vector<std::vector<double>> by_layer;
  for (int64_t layer = 0; layer < model.num_layers; ++layer) {
    if (!model.moe.moe_layer(layer)) continue;
    by_layer.push_back(megaplan::test::logged_iteration_values(
        scratch.file(prefix + "single.jsonl"), "/tokens_per_expert_max_mean_by_layer/" + std::to_string(layer)));
  }
  REQUIRE(!by_layer.empty());
  for (std::size_t i = 0; i < single_load.size(); ++i) {
    double mean = 0;
    for (const std::vector<double>& layer : by_layer) mean += layer[i] / static_cast<double>(by_layer.size());
    CHECK(mean == Approx(single_load[i]).epsilon(1e-12));
  }
  for (std::size_t l = 0; l < layouts.size(); ++l) {
    INFO("tokens per expert, " << layouts[l].name);
    const std::vector<double> run = load("layout" + std::to_string(l));
    REQUIRE(run.size() == single_load.size());
    for (std::size_t i = 0; i < run.size(); ++i) {
      if (layouts[l].plan.expert_model_parallel_size == 1) {
        CHECK(run[i] == Approx(single_load[i]).epsilon(1e-6));
      } else {
        CHECK(run[i] >= 1.0);
        CHECK(run[i] <= 4.0);  // one expert of four took every row
      }
    }
  }
  for (const std::string& key : keys) {
    const auto logged = [&](const std::string& run) {
      return megaplan::test::logged_iteration_values(scratch.file(prefix + run + ".jsonl"), key);
    };
    const std::vector<double> expected = logged("single");
    REQUIRE(expected.size() == 12);
    CHECK(expected.front() > 0);
    for (std::size_t l = 0; l < layouts.size(); ++l) {
      INFO(key << ", layout " << l);
      const std::vector<double> run = logged("layout" + std::to_string(l));
      REQUIRE(run.size() == expected.size());
      for (std::size_t i = 0; i < run.size(); ++i) CHECK(run[i] == Approx(expected[i]).epsilon(1e-4));
    }
  }
}

}  // namespace

TEST_CASE("every pipeline schedule, data-parallel layout and recomputation trains like one rank", "[parallel]") {
  const megaplan::test::ScratchDirectory scratch;
  const std::string corpus = megaplan::test::sentence_corpus(scratch);
  const megaplan::ModelSpec model = four_layer_gpt();
  const exec::TrainOptions options = options_for(corpus);
  const Outcome single = train(model, plan_of(1, 1, 1, 1, ScheduleKind::kOneFOneB), options, scratch, "single");
  REQUIRE(single.losses.size() == 12);
  REQUIRE(single.losses.back() < single.losses.front());  // it learns: the comparison means something

  const auto recomputed = [](ParallelPlan plan, megaplan::RecomputeGranularity granularity,
                             megaplan::RecomputeMethod method, int64_t layers) {
    plan.recompute_granularity = granularity;
    plan.recompute_method = method;
    plan.recompute_num_layers = layers;
    return plan;
  };
  using megaplan::RecomputeGranularity;
  using megaplan::RecomputeMethod;
  ParallelPlan distributed = plan_of(1, 1, 2, 1, ScheduleKind::kOneFOneB);
  distributed.use_distributed_optimizer = true;
  ParallelPlan pipeline_data = plan_of(1, 2, 2, 1, ScheduleKind::kOneFOneB);
  pipeline_data.use_distributed_optimizer = true;
  const auto sequence_parallel = [](ParallelPlan plan) {
    plan.sequence_parallel = true;
    return plan;
  };
  ParallelPlan everything = sequence_parallel(plan_of(2, 2, 2, 1, ScheduleKind::kOneFOneB));
  everything.use_distributed_optimizer = true;
  // Uneven stages (Megatron's --decoder-first-pipeline-num-layers 1): one layer, then three.
  const auto uneven = [](ParallelPlan plan) {
    plan.pipeline_split.first_stage_layers = 1;
    return plan;
  };
  const std::vector<Layout> layouts = {
      {"pp2 1f1b, uneven stages 1 + 3", uneven(plan_of(1, 2, 1, 1, ScheduleKind::kOneFOneB))},
      {"pp2 zb-h1, uneven stages 1 + 3, full recomputation uniform 2",
       recomputed(uneven(plan_of(1, 2, 1, 1, ScheduleKind::kZeroBubbleH1)), RecomputeGranularity::kFull,
                  RecomputeMethod::kUniform, 2)},
      {"pp2 gpipe", plan_of(1, 2, 1, 1, ScheduleKind::kGPipe)},
      {"pp2 1f1b", plan_of(1, 2, 1, 1, ScheduleKind::kOneFOneB)},
      {"pp2 interleaved vpp2", plan_of(1, 2, 1, 2, ScheduleKind::kInterleaved)},
      {"pp2 zb-h1", plan_of(1, 2, 1, 1, ScheduleKind::kZeroBubbleH1)},
      {"pp2 zbv", plan_of(1, 2, 1, 2, ScheduleKind::kZeroBubbleV)},
      {"pp2 dualpipev", plan_of(1, 2, 1, 2, ScheduleKind::kDualPipeV)},
      {"dp2", plan_of(1, 1, 2, 1, ScheduleKind::kOneFOneB)},
      {"dp2 distributed optimizer", distributed},
      {"pp2 x dp2 distributed optimizer", pipeline_data},
      {"tp2", plan_of(2, 1, 1, 1, ScheduleKind::kOneFOneB)},
      {"tp2 sequence parallel", sequence_parallel(plan_of(2, 1, 1, 1, ScheduleKind::kOneFOneB))},
      {"tp2 x pp2 x dp2, sequence parallel, distributed optimizer", everything},
      {"tp2 sequence parallel x pp2 zb-h1", sequence_parallel(plan_of(2, 2, 1, 1, ScheduleKind::kZeroBubbleH1))},
      {"tp2 sequence parallel, full recomputation",
       recomputed(sequence_parallel(plan_of(2, 1, 1, 1, ScheduleKind::kOneFOneB)), RecomputeGranularity::kFull,
                  RecomputeMethod::kUniform, 2)},
      {"selective recomputation", recomputed(plan_of(1, 1, 1, 1, ScheduleKind::kOneFOneB),
                                             RecomputeGranularity::kSelective, RecomputeMethod::kUniform, 1)},
      {"full recomputation, uniform 3", recomputed(plan_of(1, 1, 1, 1, ScheduleKind::kOneFOneB),
                                                   RecomputeGranularity::kFull, RecomputeMethod::kUniform, 3)},
      {"pp2 1f1b, full recomputation, block 1", recomputed(plan_of(1, 2, 1, 1, ScheduleKind::kOneFOneB),
                                                           RecomputeGranularity::kFull, RecomputeMethod::kBlock, 1)},
      {"pp2 zbv, full recomputation, uniform 1", recomputed(plan_of(1, 2, 1, 2, ScheduleKind::kZeroBubbleV),
                                                            RecomputeGranularity::kFull, RecomputeMethod::kUniform, 1)},
      {"pp2 zb-h1, selective recomputation",
       recomputed(plan_of(1, 2, 1, 1, ScheduleKind::kZeroBubbleH1), RecomputeGranularity::kSelective,
                  RecomputeMethod::kUniform, 1)},
  };
  check_trains_like(single, model, layouts, options, scratch);
}

TEST_CASE("the Llama family's layers train under tensor, pipeline and data parallelism like one rank",
          "[parallel][llama]") {
  // RMSNorm, SwiGLU, RoPE, 4 heads in 2 query groups (one group per tp rank), untied, no biases;
  // Qwen2's QKV biases with a head dimension of its own (queries wider than the stream), half of it
  // rotated; and Qwen3's query and key norms, whose weights each tp rank's heads train a part of
  // (summed over tp, with or without sequence parallelism).
  const megaplan::test::ScratchDirectory scratch;
  const exec::TrainOptions options = options_for(megaplan::test::sentence_corpus(scratch));
  for (const megaplan::ModelSpec& model :
       {megaplan::test::four_layer_llama(), megaplan::test::four_layer_qwen(), megaplan::test::four_layer_qwen3()}) {
    INFO(model.name);
    const Outcome single =
        train(model, plan_of(1, 1, 1, 1, ScheduleKind::kOneFOneB), options, scratch, model.name + "-single");
    REQUIRE(single.losses.size() == 12);
    REQUIRE(single.losses.back() < single.losses.front());
    ParallelPlan sequence_parallel = plan_of(2, 1, 1, 1, ScheduleKind::kOneFOneB);
    sequence_parallel.sequence_parallel = true;
    ParallelPlan everything = plan_of(2, 2, 2, 1, ScheduleKind::kOneFOneB);
    everything.sequence_parallel = true;
    everything.use_distributed_optimizer = true;
    ParallelPlan selective = plan_of(1, 2, 1, 1, ScheduleKind::kZeroBubbleH1);
    selective.recompute_granularity = megaplan::RecomputeGranularity::kSelective;
    check_trains_like(single, model,
                      {{"tp2", plan_of(2, 1, 1, 1, ScheduleKind::kOneFOneB)},
                       {"tp2 sequence parallel", sequence_parallel},
                       {"pp2 interleaved vpp2", plan_of(1, 2, 1, 2, ScheduleKind::kInterleaved)},
                       {"pp2 zb-h1, selective recomputation", selective},
                       {"pp2 dualpipev", plan_of(1, 2, 1, 2, ScheduleKind::kDualPipeV)},
                       {"tp2 x pp2 x dp2, sequence parallel, distributed optimizer", everything}},
                      options, scratch, model.name + "-");
  }
}

TEST_CASE("MoE layers train under pipeline, data and expert parallelism like one rank", "[parallel][moe]") {
  // Mixtral's layers between dense ones, and Qwen2-MoE's with a gated shared expert, the sequence
  // loss and a padded capacity (training_fixtures.h): every layout routes each token as one rank
  // does, adds the router losses' gradients at the LM loss's scale and reduces the experts'
  // gradients with the rest. Under expert parallelism each rank holds 4 / ep of the experts, the
  // tokens travel to them and back by all-to-all, and the experts' gradients are summed over
  // their own replicas (the expert data-parallel group: one rank at ep 2 of dp 2, two at ep 2 of
  // dp 4); the tolerance above holds, the sums over ranks reordering fp32 additions only.
  const megaplan::test::ScratchDirectory scratch;
  const exec::TrainOptions options = options_for(megaplan::test::sentence_corpus(scratch));
  for (const megaplan::ModelSpec& model :
       {megaplan::test::four_layer_mixtral(), megaplan::test::four_layer_qwen_moe()}) {
    INFO(model.name);
    const Outcome single =
        train(model, plan_of(1, 1, 1, 1, ScheduleKind::kOneFOneB), options, scratch, model.name + "-single");
    REQUIRE(single.losses.size() == 12);
    REQUIRE(single.losses.back() < single.losses.front());
    // The weights compared below hold the router and the experts (Megatron-Core's names).
    const auto& weights = single.summary.final_weights;
    CHECK(weights.count("decoder.layers.2.mlp.router.weight") == 1);
    CHECK(weights.count("decoder.layers.2.mlp.experts.local_experts.3.linear_fc2.weight") == 1);
    CHECK(weights.count("decoder.layers.1.mlp.linear_fc1.weight") == (model.moe.layer_freq == 2 ? 1 : 0));
    ParallelPlan distributed = plan_of(1, 1, 2, 1, ScheduleKind::kOneFOneB);
    distributed.use_distributed_optimizer = true;
    ParallelPlan pipeline_data = plan_of(1, 2, 2, 1, ScheduleKind::kOneFOneB);
    pipeline_data.use_distributed_optimizer = true;
    ParallelPlan selective = plan_of(1, 2, 1, 1, ScheduleKind::kOneFOneB);
    selective.recompute_granularity = megaplan::RecomputeGranularity::kSelective;
    const auto ep_of = [](int64_t ep, ParallelPlan plan) {
      plan.expert_model_parallel_size = ep;
      return plan;
    };
    ParallelPlan expert_distributed = ep_of(2, plan_of(1, 1, 4, 1, ScheduleKind::kOneFOneB));
    expert_distributed.use_distributed_optimizer = true;
    // Full recomputation runs each MoE layer's forward again before its backward (the all-to-alls
    // too), adding nothing to the router losses or their log the second time.
    ParallelPlan full = plan_of(1, 2, 1, 1, ScheduleKind::kOneFOneB);
    full.recompute_granularity = megaplan::RecomputeGranularity::kFull;
    full.recompute_num_layers = 2;
    ParallelPlan expert_full = ep_of(2, plan_of(1, 1, 2, 1, ScheduleKind::kOneFOneB));
    expert_full.recompute_granularity = megaplan::RecomputeGranularity::kFull;
    expert_full.recompute_method = megaplan::RecomputeMethod::kBlock;
    expert_full.recompute_num_layers = 3;
    const std::vector<Layout> layouts = {
        {"pp2 1f1b, full recomputation uniform 2", full},
        {"ep2, full recomputation block 3", expert_full},
        {"pp2 1f1b", plan_of(1, 2, 1, 1, ScheduleKind::kOneFOneB)},
        {"pp2 gpipe", plan_of(1, 2, 1, 1, ScheduleKind::kGPipe)},
        {"pp2 interleaved vpp2", plan_of(1, 2, 1, 2, ScheduleKind::kInterleaved)},
        {"pp2 1f1b, selective recomputation", selective},
        {"dp2", plan_of(1, 1, 2, 1, ScheduleKind::kOneFOneB)},
        {"dp2 distributed optimizer", distributed},
        {"pp2 x dp2 distributed optimizer", pipeline_data},
        {"ep2", ep_of(2, plan_of(1, 1, 2, 1, ScheduleKind::kOneFOneB))},
        {"ep4", ep_of(4, plan_of(1, 1, 4, 1, ScheduleKind::kOneFOneB))},
        {"ep2 x dp2 distributed optimizer", expert_distributed},
        {"ep2 x pp2 interleaved vpp2", ep_of(2, plan_of(1, 2, 2, 2, ScheduleKind::kInterleaved))}};
    check_trains_like(single, model, layouts, options, scratch, model.name + "-");
    check_router_logs(single, model, layouts, scratch, model.name + "-");
  }
}

TEST_CASE("MoE layers train under schedules that split the backward like one rank", "[parallel][moe]") {
  // ZB-H1, ZBV and DualPipeV split each backward into I (the input gradients, with the all-to-alls
  // and the tp collectives) and W (the weight GEMMs, later): I keeps the experts' fc2 and fc1
  // output gradients over the rows they computed, the router's and the shared expert's, and W
  // computes their weight gradients from them and what the forward kept. Every layout is the single
  // rank's within the tolerance above; DualPipeV overlaps a forward with a backward of the other
  // chunk. Full recomputation keeps its borrowed sets, the MoE MLP's among them, from I until W.
  // Global batches of 8 microbatches: DualPipeV takes 2 x pp a replica at dp 2.
  const megaplan::test::ScratchDirectory scratch;
  const exec::TrainOptions options = options_for(megaplan::test::sentence_corpus(scratch));
  const auto split = [](int64_t tp, int64_t pp, int64_t dp, int64_t vpp, ScheduleKind schedule, int64_t ep = 1) {
    ParallelPlan plan = megaplan::test::layout(tp, pp, dp, vpp, schedule, 2, 16);
    plan.expert_model_parallel_size = ep;
    plan.sequence_parallel = tp > 1;
    return plan;
  };
  for (const megaplan::ModelSpec& model :
       {megaplan::test::four_layer_mixtral(), megaplan::test::four_layer_shared_expert_moe()}) {
    INFO(model.name);
    const std::string prefix = model.name + "-split-";
    const Outcome single =
        train(model, split(1, 1, 1, 1, ScheduleKind::kOneFOneB), options, scratch, prefix + "single");
    REQUIRE(single.losses.back() < single.losses.front());
    ParallelPlan full = split(1, 2, 1, 1, ScheduleKind::kZeroBubbleH1);
    full.recompute_granularity = megaplan::RecomputeGranularity::kFull;
    ParallelPlan everything = split(2, 2, 2, 2, ScheduleKind::kDualPipeV, 2);
    everything.use_distributed_optimizer = true;
    const std::vector<Layout> layouts = {
        {"pp2 zb-h1", split(1, 2, 1, 1, ScheduleKind::kZeroBubbleH1)},
        {"pp2 zb-h1, full recomputation", full},
        {"ep2 x pp2 zbv", split(1, 2, 2, 2, ScheduleKind::kZeroBubbleV, 2)},
        {"pp2 dualpipev", split(1, 2, 1, 2, ScheduleKind::kDualPipeV)},
        {"tp2 x pp2 x ep2 dualpipev, sequence parallel, distributed optimizer", everything}};
    check_trains_like(single, model, layouts, options, scratch, prefix);
    check_router_logs(single, model, layouts, scratch, prefix);
  }
}

TEST_CASE("MoE layers train under tensor parallelism with sequence parallelism like one rank", "[parallel][moe]") {
  // Each tp rank routes its own rows of the stream; the tp group gathers the rows that arrive for
  // its experts, each rank computes its shard of every expert and the partial outputs are
  // reduce-scattered home. The switch loss balances the group's tokens (its counts summed over tp),
  // the z loss is each rank's share of the group's mean, and the router's and shared gate's
  // gradients are summed over tp as the norms' are: every layout is the single rank's within the
  // tolerance above (the tp sums reorder fp32 additions). Mixtral's layers between dense ones,
  // Qwen2-MoE's gated shared expert with the switch loss, and with its sequence loss (each tp rank
  // holds one of a microbatch's two sequences), dropless: under tp a capacity is each rank's own
  // tokens' (Megatron's). Qwen3-MoE's layers after a dense one, with its query and key norms.
  const megaplan::test::ScratchDirectory scratch;
  const exec::TrainOptions options = options_for(megaplan::test::sentence_corpus(scratch));
  const auto sequence_parallel = [](int64_t ep, ParallelPlan plan) {
    plan.sequence_parallel = true;
    plan.expert_model_parallel_size = ep;
    return plan;
  };
  for (const megaplan::ModelSpec& model :
       {megaplan::test::four_layer_mixtral(), megaplan::test::four_layer_shared_expert_moe(),
        megaplan::test::four_layer_dropless_qwen_moe(), megaplan::test::four_layer_qwen3_moe()}) {
    INFO(model.name);
    const std::string prefix = model.name + "-tp-";
    const Outcome single =
        train(model, plan_of(1, 1, 1, 1, ScheduleKind::kOneFOneB), options, scratch, prefix + "single");
    REQUIRE(single.losses.back() < single.losses.front());
    ParallelPlan everything = sequence_parallel(2, plan_of(2, 2, 2, 1, ScheduleKind::kOneFOneB));
    everything.use_distributed_optimizer = true;
    ParallelPlan full = sequence_parallel(2, plan_of(2, 1, 2, 1, ScheduleKind::kOneFOneB));
    full.recompute_granularity = megaplan::RecomputeGranularity::kFull;
    // --expert-tensor-parallel-size 1: whole experts on each tp rank, the ep group across tp ranks
    // (ep 2 of tp 2 x dp 1 is the tp pair), their gradients summed over the expert data-parallel
    // group (the tp pair at ep 1).
    const auto whole_experts = [](ParallelPlan plan) {
      plan.expert_tensor_parallel_size = 1;
      return plan;
    };
    ParallelPlan whole_everything = whole_experts(sequence_parallel(4, plan_of(2, 2, 2, 1, ScheduleKind::kOneFOneB)));
    whole_everything.use_distributed_optimizer = true;
    const std::vector<Layout> layouts = {
        {"ep2 x tp2 sequence parallel, full recomputation", full},
        {"tp2 sequence parallel", sequence_parallel(1, plan_of(2, 1, 1, 1, ScheduleKind::kOneFOneB))},
        {"ep2 x tp2 sequence parallel", sequence_parallel(2, plan_of(2, 1, 2, 1, ScheduleKind::kOneFOneB))},
        {"tp2 x pp2 x ep2 sequence parallel, distributed optimizer", everything},
        {"tp2 sequence parallel, etp 1",
         whole_experts(sequence_parallel(1, plan_of(2, 1, 1, 1, ScheduleKind::kOneFOneB)))},
        {"tp2 x ep2 sequence parallel, etp 1 (the ep group is the tp pair)",
         whole_experts(sequence_parallel(2, plan_of(2, 1, 1, 1, ScheduleKind::kOneFOneB)))},
        {"tp2 x pp2 x dp2 x ep4 sequence parallel, etp 1, distributed optimizer", whole_everything}};
    check_trains_like(single, model, layouts, options, scratch, prefix);
    check_router_logs(single, model, layouts, scratch, prefix);
    // The gradient norm counts each whole expert once, not once a tp rank: etp 1's is the experts
    // cut over tp's (a whole expert's squares twice move it by about 1e-4).
    check_same_gradient_norms(scratch, prefix, 1, 4);
  }
}

TEST_CASE("MoE experts cut over an etp group other than tp train like one rank", "[parallel][moe]") {
  // --expert-tensor-parallel-size 2 under tp 4: each tp rank routes its own rows, the etp pair
  // gathers the rows that arrive for its experts and each computes its half of every one; etp 4
  // under tp 2: the etp group spans two data-parallel replicas' tp pairs. The experts' gradients are
  // summed over the ranks holding the same shard (the expert data-parallel group), the gradient norm
  // counts each shard once, and the logged load is the microbatch's (the ranks' own summed over tp).
  // Four query groups, so that tp 4 cuts the heads; the byte vocabulary's 257 padded to 260 at tp 1,
  // 2 and 4 alike (a multiple of 65 x tp).
  const megaplan::test::ScratchDirectory scratch;
  const exec::TrainOptions options = options_for(megaplan::test::sentence_corpus(scratch));
  const auto cut = [](int64_t tp, int64_t dp, int64_t ep, int64_t etp) {
    ParallelPlan plan = plan_of(tp, 1, dp, 1, ScheduleKind::kOneFOneB);
    plan.sequence_parallel = true;
    plan.expert_model_parallel_size = ep;
    plan.expert_tensor_parallel_size = etp == tp ? 0 : etp;
    return plan;
  };
  for (megaplan::ModelSpec model :
       {megaplan::test::four_layer_mixtral(), megaplan::test::four_layer_shared_expert_moe()}) {
    model.num_query_groups = model.num_attention_heads;
    model.make_vocab_size_divisible_by = 65;
    INFO(model.name);
    const std::string prefix = model.name + "-etp-";
    const Outcome single =
        train(model, plan_of(1, 1, 1, 1, ScheduleKind::kOneFOneB), options, scratch, prefix + "single");
    REQUIRE(single.losses.back() < single.losses.front());
    ParallelPlan everything = cut(4, 2, 2, 2);
    everything.use_distributed_optimizer = true;
    const std::vector<Layout> layouts = {
        {"tp4 sequence parallel (etp 4)", cut(4, 1, 1, 4)},
        {"tp4 sequence parallel, etp 2", cut(4, 1, 1, 2)},
        {"tp4 x ep2 sequence parallel, etp 2", cut(4, 1, 2, 2)},
        {"tp2 x dp2 sequence parallel, etp 4", cut(2, 2, 1, 4)},
        {"tp4 x dp2 x ep2 sequence parallel, etp 2, distributed optimizer", everything}};
    check_trains_like(single, model, layouts, options, scratch, prefix);
    check_router_logs(single, model, layouts, scratch, prefix);
    check_same_gradient_norms(scratch, prefix, 0, 1);  // each expert's shard counted once
  }
}

TEST_CASE("MoE layers train under context parallelism like one rank", "[parallel][moe][context_parallel]") {
  // Each cp rank routes its own tokens of every sequence (two chunks of each, the ring's attention
  // between them); the switch loss's counts are summed over the cp group (and tp's), the z loss is
  // each rank's share of the group's mean, the losses' log is summed over the group and the experts'
  // load for the log is the microbatch's, as one rank routes it. Dropless: a capacity is each rank's
  // own tokens' (Megatron's). Mixtral's layers between dense ones (the switch loss), the gated
  // shared expert (switch and z losses), Qwen3-MoE's query and key norms.
  const megaplan::test::ScratchDirectory scratch;
  const exec::TrainOptions options = options_for(megaplan::test::sentence_corpus(scratch));
  const auto context = [](int64_t cp, ParallelPlan plan) {
    plan.context_parallel_size = cp;
    return plan;
  };
  for (const megaplan::ModelSpec& model :
       {megaplan::test::four_layer_mixtral(), megaplan::test::four_layer_shared_expert_moe(),
        megaplan::test::four_layer_qwen3_moe()}) {
    INFO(model.name);
    const std::string prefix = model.name + "-cp-";
    const Outcome single =
        train(model, plan_of(1, 1, 1, 1, ScheduleKind::kOneFOneB), options, scratch, prefix + "single");
    REQUIRE(single.losses.back() < single.losses.front());
    ParallelPlan tensor_context = context(2, plan_of(2, 1, 1, 1, ScheduleKind::kOneFOneB));
    tensor_context.sequence_parallel = true;
    ParallelPlan expert_context = context(2, plan_of(1, 1, 2, 1, ScheduleKind::kOneFOneB));
    expert_context.expert_model_parallel_size = 2;
    expert_context.use_distributed_optimizer = true;
    const std::vector<Layout> layouts = {
        {"cp2", context(2, plan_of(1, 1, 1, 1, ScheduleKind::kOneFOneB))},
        {"cp2 x pp2 interleaved vpp2", context(2, plan_of(1, 2, 1, 2, ScheduleKind::kInterleaved))},
        {"tp2 x cp2 sequence parallel", tensor_context},
        {"cp2 x dp2 x ep2 distributed optimizer", expert_context}};
    check_trains_like(single, model, layouts, options, scratch, prefix);
    check_router_logs(single, model, layouts, scratch, prefix);
  }
}

namespace {

// The expert biases a run saved at its last iteration (state.json's "expert_biases").
nlohmann::json saved_expert_biases(const std::string& directory, int64_t iteration) {
  char name[32];
  std::snprintf(name, sizeof name, "/iter_%07lld/state.json", static_cast<long long>(iteration));
  return nlohmann::json::parse(megaplan::read_file_contents(directory + name)).at("expert_biases");
}

}  // namespace

TEST_CASE("the aux-loss-free expert bias moves as one rank's under every layout", "[parallel][moe]") {
  // Each rank counts the routes its own tokens took; OPTIM sums the counts over tp and dp (every
  // token of the iteration) and moves each bias by the rate toward balance, so every layout moves
  // the single rank's biases. The biases are multiples of the rate, equal bit for bit when the
  // counts are; the losses and weights within the tolerance above.
  const megaplan::test::ScratchDirectory scratch;
  const exec::TrainOptions options = options_for(megaplan::test::sentence_corpus(scratch));
  const megaplan::ModelSpec model = megaplan::test::four_layer_balanced_moe();
  const auto saving = [&](const std::string& name) {
    exec::TrainOptions saved = options;
    saved.save = scratch.file(name + "-checkpoints");
    return saved;
  };
  const Outcome single =
      train(model, plan_of(1, 1, 1, 1, ScheduleKind::kOneFOneB), saving("single"), scratch, "single");
  REQUIRE(single.losses.size() == 12);
  const nlohmann::json biases = saved_expert_biases(scratch.file("single-checkpoints"), 12);
  REQUIRE(biases.size() == 4);  // every layer has experts
  // The byte corpus routes unevenly: the biases moved, each by a whole number of steps of 1e-2.
  double moved = 0;
  for (const auto& [layer, values] : biases.items()) {
    REQUIRE(values.size() == 4);
    for (const nlohmann::json& value : values) moved = std::max(moved, std::abs(value.get<double>()));
  }
  CHECK(moved >= 2e-2);
  CHECK(moved <= 12e-2 + 1e-6);
  // Without the bias the routing, and so the losses, differ.
  megaplan::ModelSpec unbiased = model;
  unbiased.moe.router_enable_expert_bias = false;
  const Outcome plain = train(unbiased, plan_of(1, 1, 1, 1, ScheduleKind::kOneFOneB), options, scratch, "unbiased");
  CHECK(plain.losses.back() != Approx(single.losses.back()).epsilon(1e-6));

  const auto with = [](int64_t ep, bool sequence_parallel, bool distributed, ParallelPlan plan) {
    plan.expert_model_parallel_size = ep;
    plan.sequence_parallel = sequence_parallel;
    plan.use_distributed_optimizer = distributed;
    return plan;
  };
  const std::vector<Layout> layouts = {
      {"ep2", with(2, false, false, plan_of(1, 1, 2, 1, ScheduleKind::kOneFOneB))},
      {"ep2 x tp2 sequence parallel", with(2, true, false, plan_of(2, 1, 2, 1, ScheduleKind::kOneFOneB))},
      {"pp2 x dp2 distributed optimizer", with(1, false, true, plan_of(1, 2, 2, 1, ScheduleKind::kOneFOneB))},
      {"tp2 x pp2 x ep2 sequence parallel, interleaved",
       with(2, true, true, plan_of(2, 2, 2, 2, ScheduleKind::kInterleaved))}};
  for (std::size_t l = 0; l < layouts.size(); ++l) {
    INFO(layouts[l].name);
    const std::string name = "layout" + std::to_string(l);
    const Outcome run = train(model, layouts[l].plan, saving(name), scratch, name);
    REQUIRE(run.losses.size() == single.losses.size());
    for (std::size_t i = 0; i < single.losses.size(); ++i) {
      INFO("iteration " << i + 1);
      CHECK(run.losses[i] == Approx(single.losses[i]).epsilon(1e-4));
    }
    CHECK(saved_expert_biases(scratch.file(name + "-checkpoints"), 12) == biases);
  }
}

TEST_CASE("context parallelism trains like one rank under tensor, pipeline and data parallelism",
          "[parallel][context_parallel]") {
  // Each cp rank holds two chunks of every sequence and attention runs as a ring; the tolerance
  // above holds: the ring merges the blocks' softmax by their log-sum-exp, and the gradients of the
  // cp ranks' parts of each sequence add up over the dp-cp group, reordering fp32 sums as data
  // parallelism does. With dropout every cp rank draws the single rank's masks at its tokens'
  // places (a wrong place moves the losses by more than 1e-3, as the dropout test measures).
  const megaplan::test::ScratchDirectory scratch;
  const exec::TrainOptions options = options_for(megaplan::test::sentence_corpus(scratch));
  const auto cp_of = [](int64_t cp, ParallelPlan plan) {
    plan.context_parallel_size = cp;
    return plan;
  };
  for (const megaplan::ModelSpec& model : {four_layer_gpt(), megaplan::test::four_layer_llama()}) {
    INFO(model.name);
    const Outcome single =
        train(model, plan_of(1, 1, 1, 1, ScheduleKind::kOneFOneB), options, scratch, model.name + "-cp-single");
    ParallelPlan sequence_parallel = cp_of(2, plan_of(2, 1, 1, 1, ScheduleKind::kOneFOneB));
    sequence_parallel.sequence_parallel = true;
    ParallelPlan distributed = cp_of(2, plan_of(1, 1, 2, 1, ScheduleKind::kOneFOneB));
    distributed.use_distributed_optimizer = true;
    ParallelPlan selective = cp_of(2, plan_of(1, 1, 1, 1, ScheduleKind::kOneFOneB));
    selective.recompute_granularity = megaplan::RecomputeGranularity::kSelective;
    check_trains_like(single, model,
                      {{"cp2", cp_of(2, plan_of(1, 1, 1, 1, ScheduleKind::kOneFOneB))},
                       {"cp4", cp_of(4, plan_of(1, 1, 1, 1, ScheduleKind::kOneFOneB))},
                       {"tp2 x cp2, sequence parallel", sequence_parallel},
                       {"cp2 x pp2 1f1b", cp_of(2, plan_of(1, 2, 1, 1, ScheduleKind::kOneFOneB))},
                       {"cp2 x pp2 interleaved vpp2", cp_of(2, plan_of(1, 2, 1, 2, ScheduleKind::kInterleaved))},
                       {"cp2 x dp2, distributed optimizer", distributed},
                       {"cp2, selective recomputation", selective}},
                      options, scratch, model.name + "-cp-");
  }
  ParallelPlan with_dropout = plan_of(1, 1, 1, 1, ScheduleKind::kOneFOneB);
  with_dropout.options.hidden_dropout = 0.1;
  with_dropout.options.attention_dropout = 0.1;
  const Outcome single = train(four_layer_gpt(), with_dropout, options, scratch, "cp-dropout-single");
  ParallelPlan everything = cp_of(2, with_dropout);
  everything.tensor_parallel_size = 2;
  everything.sequence_parallel = true;
  check_trains_like(single, four_layer_gpt(),
                    {{"cp2, dropout", cp_of(2, with_dropout)}, {"tp2 x cp2, sequence parallel, dropout", everything}},
                    options, scratch, "cp-dropout-");
  // RoPE at the tokens' places with Llama 3.1's scaled frequencies (scaled from wavelength 16 up,
  // so that they bite at seq 16) on half of each head of 16, Qwen2's QKV biases beside.
  megaplan::ModelSpec scaled = megaplan::test::four_layer_qwen();
  scaled.rope_scaling.factor = 8;
  scaled.rope_scaling.original_max_position_embeddings = 16;
  const ParallelPlan one = plan_of(1, 1, 1, 1, ScheduleKind::kOneFOneB);
  const Outcome scaled_single = train(scaled, one, options, scratch, "cp-rope-scaling-single");
  check_trains_like(scaled_single, scaled, {{"cp2, Llama 3.1 RoPE scaling", cp_of(2, one)}}, options, scratch,
                    "cp-rope-scaling-");
}

TEST_CASE("every layout starts from the single rank's weights bit for bit", "[parallel]") {
  // Each rank draws only its part of each tensor, as the whole tensor's elements at their places.
  // At --lr 0 an iteration leaves every weight as drawn (AdamW subtracts 0 x its update), so the
  // final weights are the first: gathered from the tensor-parallel parts of every pipeline stage
  // and, under the distributed optimizer, from each data-parallel replica's shard, they must equal
  // the single rank's bit for bit. The V schedule's last stage reads stage 0's embedding on its rank.
  const megaplan::test::ScratchDirectory scratch;
  exec::TrainOptions options = options_for(megaplan::test::sentence_corpus(scratch));
  options.train_iters = 1;
  options.learning_rate.max_lr = 0;
  options.learning_rate.warmup_iterations = 0;
  ParallelPlan everything = plan_of(2, 2, 2, 1, ScheduleKind::kOneFOneB);
  everything.use_distributed_optimizer = true;
  for (const megaplan::ModelSpec& model : {four_layer_gpt(), megaplan::test::four_layer_llama()}) {
    const Outcome single =
        train(model, plan_of(1, 1, 1, 1, ScheduleKind::kOneFOneB), options, scratch, model.name + "-first-single");
    REQUIRE(single.summary.final_weights.size() > 20);
    const std::vector<Layout> layouts = {{"tp2 x pp2 x dp2, distributed optimizer", everything},
                                         {"pp2 dualpipev", plan_of(1, 2, 1, 2, ScheduleKind::kDualPipeV)}};
    for (std::size_t l = 0; l < layouts.size(); ++l) {
      INFO(model.name << ", " << layouts[l].name);
      const Outcome run = train(model, layouts[l].plan, options, scratch, model.name + "-first-" + std::to_string(l));
      for (const auto& [name, expected] : single.summary.final_weights) {
        INFO(name);
        const auto found = run.summary.final_weights.find(name);
        REQUIRE(found != run.summary.final_weights.end());
        REQUIRE(found->second.size() == expected.size());
        CHECK(std::memcmp(found->second.data(), expected.data(), expected.size() * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("with dropout every layout draws the single rank's masks and trains like it", "[parallel][dropout]") {
  // --hidden-dropout and --attention-dropout 0.1 (Megatron's defaults): the masks are drawn from the
  // seed, the layer, the global sample and the element's place in the whole model, so tensor,
  // sequence, pipeline and data parallelism, the zero-bubble split and recomputation all drop the
  // elements the single rank drops.
  const megaplan::test::ScratchDirectory scratch;
  const exec::TrainOptions options = options_for(megaplan::test::sentence_corpus(scratch));
  for (const megaplan::ModelSpec& model : {four_layer_gpt(), megaplan::test::four_layer_llama()}) {
    INFO(model.name);
    const auto with_dropout = [](ParallelPlan plan) {
      plan.options.hidden_dropout = 0.1;
      plan.options.attention_dropout = 0.1;
      return plan;
    };
    const Outcome single = train(model, with_dropout(plan_of(1, 1, 1, 1, ScheduleKind::kOneFOneB)), options, scratch,
                                 model.name + "-dropout-single");
    REQUIRE(single.losses.size() == 12);
    REQUIRE(single.losses.back() < single.losses.front());
    // Dropout changes the run by far more than the layouts' 1e-4 (measured: up to 1.9e-3 relative
    // for the GPT, 6.5e-3 for the Llama), so a layout drawing other masks would fail.
    const Outcome plain =
        train(model, plan_of(1, 1, 1, 1, ScheduleKind::kOneFOneB), options, scratch, model.name + "-no-dropout");
    double moved = 0;
    for (std::size_t i = 0; i < single.losses.size(); ++i) {
      moved = std::max(moved, std::abs(plain.losses[i] - single.losses[i]) / plain.losses[i]);
    }
    CHECK(moved > 1e-3);
    ParallelPlan everything = with_dropout(plan_of(2, 2, 2, 1, ScheduleKind::kOneFOneB));
    everything.sequence_parallel = true;
    everything.use_distributed_optimizer = true;
    ParallelPlan recomputed = with_dropout(plan_of(2, 2, 1, 2, ScheduleKind::kZeroBubbleV));
    recomputed.sequence_parallel = true;
    recomputed.recompute_granularity = megaplan::RecomputeGranularity::kFull;
    recomputed.recompute_method = megaplan::RecomputeMethod::kUniform;
    recomputed.recompute_num_layers = 1;
    ParallelPlan selective = with_dropout(plan_of(1, 2, 1, 1, ScheduleKind::kZeroBubbleH1));
    selective.recompute_granularity = megaplan::RecomputeGranularity::kSelective;
    check_trains_like(single, model,
                      {{"tp2", with_dropout(plan_of(2, 1, 1, 1, ScheduleKind::kOneFOneB))},
                       {"pp2 1f1b", with_dropout(plan_of(1, 2, 1, 1, ScheduleKind::kOneFOneB))},
                       {"dp2", with_dropout(plan_of(1, 1, 2, 1, ScheduleKind::kOneFOneB))},
                       {"tp2 x pp2 x dp2, sequence parallel, distributed optimizer", everything},
                       {"tp2 sequence parallel x pp2 zbv, full recomputation", recomputed},
                       {"pp2 zb-h1, selective recomputation", selective}},
                      options, scratch, model.name + "-dropout-");
  }
}

TEST_CASE("gradient buckets reduced as the backward fills them give the bits of a reduction at REDUCE_GRAD",
          "[parallel]") {
  // Small buckets (Megatron's --ddp-bucket-size; one or two parameters each here), so that most
  // start inside the last microbatch's backward, layer by layer: one started before every
  // microbatch's gradient was in it, or on a gradient a later part still adds to, would change the
  // sums. Deferred weight gradients (zb-h1) finish buckets in W; sequence parallelism sums a
  // bucket's norm gradients over tp first.
  const megaplan::test::ScratchDirectory scratch;
  exec::TrainOptions options = options_for(megaplan::test::sentence_corpus(scratch));
  options.train_iters = 4;
  options.eval_interval = 2;
  options.ddp_bucket_size = 2000;
  ParallelPlan zero_bubble = plan_of(1, 2, 2, 1, ScheduleKind::kZeroBubbleH1);
  zero_bubble.use_distributed_optimizer = true;
  ParallelPlan everything = plan_of(2, 2, 2, 2, ScheduleKind::kInterleaved);
  everything.sequence_parallel = true;
  everything.use_distributed_optimizer = true;
  const std::vector<Layout> layouts = {
      {"dp2", plan_of(1, 1, 2, 1, ScheduleKind::kOneFOneB)},
      {"pp2 x dp2 zb-h1, distributed optimizer", zero_bubble},
      {"tp2 sequence parallel x pp2 interleaved vpp2 x dp2, distributed optimizer", everything}};
  for (std::size_t l = 0; l < layouts.size(); ++l) {
    INFO(layouts[l].name);
    ParallelPlan variant = layouts[l].plan;
    variant.options.overlap_grad_reduce = false;
    const Outcome at_reduce_grad = train(four_layer_gpt(), variant, options, scratch, "serial" + std::to_string(l));
    variant.options.overlap_grad_reduce = true;
    const Outcome overlapped = train(four_layer_gpt(), variant, options, scratch, "overlap" + std::to_string(l));
    REQUIRE(at_reduce_grad.losses.size() == 4);
    CHECK(overlapped.losses == at_reduce_grad.losses);
    CHECK(overlapped.summary.last_gradient_norm == at_reduce_grad.summary.last_gradient_norm);
    CHECK(overlapped.summary.final_weights == at_reduce_grad.summary.final_weights);
    if (!variant.use_distributed_optimizer) continue;
    // The updated shards gathered behind the next iteration's work, waited for at each chunk's
    // first forward (and before each evaluation): the same bits again.
    variant.options.overlap_param_gather = true;
    const Outcome gathered_later = train(four_layer_gpt(), variant, options, scratch, "gather" + std::to_string(l));
    CHECK(gathered_later.losses == at_reduce_grad.losses);
    CHECK(gathered_later.summary.final_weights == at_reduce_grad.summary.final_weights);
    CHECK(gathered_later.out.find("validation loss at iteration 2") != std::string::npos);
  }
}

TEST_CASE("a ramped global batch trains like one rank, steps as Megatron's ramp and resumes exactly", "[parallel]") {
  // --rampup-batch-size 4 4 12 to 8: one increment after 12 samples, so iterations 1-3 run 4
  // samples (microbatches: 2, or 1 per replica at dp 2) and the rest 8. Overlapped reduction
  // starts a bucket's all-reduce after the iteration's last microbatch, so it must follow the ramp.
  const megaplan::test::ScratchDirectory scratch;
  exec::TrainOptions options = options_for(megaplan::test::sentence_corpus(scratch));
  options.rampup = megaplan::BatchRampup{4, 4, 12};
  const megaplan::ModelSpec model = four_layer_gpt();
  const Outcome single = train(model, plan_of(1, 1, 1, 1, ScheduleKind::kOneFOneB), options, scratch, "ramp-single");
  REQUIRE(single.losses.size() == 12);
  std::vector<int64_t> batches;
  std::ifstream log(scratch.file("ramp-single.jsonl"));
  for (std::string line; std::getline(log, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record.contains("loss")) batches.push_back(record.at("global_batch_size").get<int64_t>());
  }
  CHECK(batches == std::vector<int64_t>{4, 4, 4, 8, 8, 8, 8, 8, 8, 8, 8, 8});
  CHECK(single.out.find("| global batch 4\n") != std::string::npos);

  ParallelPlan overlapped = plan_of(1, 2, 2, 1, ScheduleKind::kOneFOneB);
  overlapped.use_distributed_optimizer = true;
  overlapped.options.overlap_grad_reduce = true;
  check_trains_like(single, model,
                    {{"pp2 1f1b", plan_of(1, 2, 1, 1, ScheduleKind::kOneFOneB)},
                     {"pp2 interleaved vpp2", plan_of(1, 2, 1, 2, ScheduleKind::kInterleaved)},
                     {"pp2 zbv", plan_of(1, 2, 1, 2, ScheduleKind::kZeroBubbleV)},
                     {"pp2 x dp2, distributed optimizer, overlapped reduction", overlapped}},
                    options, scratch, "ramp-");

  // Stopped inside the ramp and resumed: the consumed samples carry the ramp on, bit for bit.
  options.save = scratch.file("ramp-checkpoints");
  options.exit_interval = 2;
  train(model, plan_of(1, 2, 1, 1, ScheduleKind::kOneFOneB), options, scratch, "ramp-first");
  options.exit_interval = 0;
  options.load = options.save;
  const Outcome rest = train(model, plan_of(1, 2, 1, 1, ScheduleKind::kOneFOneB), options, scratch, "ramp-rest");
  const std::vector<double> whole = megaplan::test::logged_losses(scratch.file("ramp-layout0.jsonl"));  // pp2 1f1b's
  REQUIRE(rest.losses.size() == 10);
  for (std::size_t i = 0; i < rest.losses.size(); ++i) {
    INFO("iteration " << i + 3);
    CHECK(rest.losses[i] == whole[i + 2]);
  }

  // A ramp step the schedule cannot run is refused before training: interleaving at pp 2 needs
  // microbatches in multiples of 2, and a ramp from 2 runs 1.
  options.rampup = megaplan::BatchRampup{2, 2, 12};
  options.load.reset();
  options.save.reset();
  try {
    train(model, plan_of(1, 2, 1, 2, ScheduleKind::kInterleaved), options, scratch, "ramp-refused");
    FAIL("a ramp of one microbatch ran an interleaved schedule");
  } catch (const megaplan::SpecError& error) {
    const std::string message = error.what();
    INFO(message);
    CHECK(message.rfind("--rampup-batch-size: the ramp's global batch 2 (1 microbatches) cannot run this plan: ", 0) ==
          0);
  }
}

TEST_CASE("a rank that fails ends every rank with its message", "[parallel]") {
  const megaplan::test::ScratchDirectory scratch;
  exec::TrainOptions options = options_for(megaplan::test::sentence_corpus(scratch));
  options.learning_rate.max_lr = 1e30;  // the weights become infinite after the first step
  options.learning_rate.min_lr = 1e30;
  options.learning_rate.warmup_iterations = 0;  // (a warm-up's first step runs at rate 0)
  options.learning_rate.style = exec::DecayStyle::kConstant;
  options.clip_grad = 0;
  const megaplan::ModelSpec model = four_layer_gpt();
  try {
    (void)train(model, plan_of(1, 2, 2, 1, ScheduleKind::kOneFOneB), options, scratch, "failing");
    FAIL("training went on with infinite weights");
  } catch (const megaplan::SpecError& error) {
    const std::string message = error.what();
    INFO(message);
    CHECK(message.find("iteration 2") != std::string::npos);
    CHECK(message.find("stopped before the optimizer step") != std::string::npos);
  }
}

TEST_CASE("a measured timeline has one slice per action of every rank's lowered list, in order", "[parallel]") {
  const megaplan::test::ScratchDirectory scratch;
  exec::TrainOptions options = options_for(megaplan::test::sentence_corpus(scratch));
  options.train_iters = 2;
  options.record_timeline = true;
  const megaplan::ModelSpec model = four_layer_gpt();
  const ParallelPlan plan = plan_of(1, 2, 2, 2, ScheduleKind::kInterleaved);
  const Outcome run = train(model, plan, options, scratch, "traced");
  check_follows_lowered_lists(run.summary.timeline, plan);
}

TEST_CASE("launched ranks gather the traced pipeline's timelines, so rank 0 holds every pipeline rank's",
          "[parallel]") {
  // train_rank is what one process of a launched world runs; here each rank is a thread with its
  // own in-process communicators, as NCCL's would be built.
  const megaplan::test::ScratchDirectory scratch;
  exec::TrainOptions options = options_for(megaplan::test::sentence_corpus(scratch));
  options.train_iters = 2;
  options.record_timeline = true;
  const megaplan::ModelSpec model = four_layer_gpt();
  const ParallelPlan plan = plan_of(1, 2, 2, 2, ScheduleKind::kInterleaved);
  megaplan::validate_plan(model, plan);
  exec::InProcessWorld world(plan.world_size(), std::chrono::minutes(2));
  std::vector<exec::TrainSummary> summaries(static_cast<std::size_t>(plan.world_size()));
  exec::run_rank_threads(world, plan.world_size(), [&](int64_t rank) {
    exec::CpuBackend backend;
    std::ostringstream out;
    summaries[static_cast<std::size_t>(rank)] = exec::train_rank(
        model, plan, options, rank, backend,
        [&](const exec::GroupKind& kind) -> std::unique_ptr<exec::Comm> {
          if (!exec::needs_communicator(kind)) return nullptr;
          return world.group(rank, kind.groups[static_cast<std::size_t>(kind.mine)], kind.label);
        },
        out);
  });
  // Every rank's slices, as that rank timed them on its own clock.
  check_follows_lowered_lists(summaries[0].timeline, plan);
}

TEST_CASE("an imported schedule runs as the generated one, and one that would hang is refused before launch",
          "[parallel]") {
  const megaplan::test::ScratchDirectory scratch;
  exec::TrainOptions options = options_for(megaplan::test::sentence_corpus(scratch));
  options.train_iters = 3;
  const megaplan::ModelSpec model = four_layer_gpt();
  const ParallelPlan plan = plan_of(1, 2, 1, 1, ScheduleKind::kOneFOneB);
  const Outcome generated = train(model, plan, options, scratch, "generated");
  options.pipeline_schedule_csv = scratch.file("1f1b.csv");
  std::ofstream(*options.pipeline_schedule_csv) << megaplan::schedule_to_csv(megaplan::generate_plan_schedule(plan));
  const Outcome imported = train(model, plan, options, scratch, "imported");
  CHECK(imported.losses == generated.losses);

  // Rank 1 runs a backward before its forward: no rank can make progress.
  std::ofstream(*options.pipeline_schedule_csv) << "0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3\n"
                                                   "1B0,1F0,1F1,1B1,1F2,1B2,1F3,1B3\n";
  try {
    (void)train(model, plan, options, scratch, "hangs");
    FAIL("a schedule that hangs was run");
  } catch (const megaplan::SpecError& error) {
    INFO(error.what());
    CHECK(error.field() == "schedule");
  }
  CHECK_FALSE(std::filesystem::exists(scratch.file("hangs.jsonl")));  // refused before any rank logged
}
