// ParallelPlan: dp derivation, vpp from layers per stage, every validation rule, JSON, JobSpec.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "core/cluster_spec.h"
#include "core/error.h"
#include "core/job_spec.h"
#include "core/model_presets.h"
#include "core/parallel_plan.h"

using Catch::Matchers::Contains;
using megaplan::ParallelPlan;
using megaplan::ScheduleKind;

namespace {

megaplan::ModelSpec model_24_layers() {
  megaplan::ModelSpec spec;
  spec.name = "m";
  spec.num_layers = 24;
  spec.hidden_size = 1024;
  spec.num_attention_heads = 16;
  spec.num_query_groups = 8;
  spec.seq_length = 2048;
  spec.vocab_size = 50257;
  return spec;
}

ParallelPlan plan_tp2_pp2_dp2() {
  ParallelPlan plan;
  plan.tensor_parallel_size = 2;
  plan.pipeline_parallel_size = 2;
  plan.data_parallel_size = 2;
  plan.micro_batch_size = 2;
  plan.global_batch_size = 16;
  return plan;
}

}  // namespace

TEST_CASE("dp is derived from the world size", "[parallel_plan]") {
  CHECK(megaplan::derive_data_parallel_size(1024, 8, 16, 1) == 8);
  CHECK(megaplan::derive_data_parallel_size(64, 2, 2, 2) == 8);
  CHECK_THROWS_WITH(megaplan::derive_data_parallel_size(16, 3, 1, 1),
                    "--gpus: world size 16 must be divisible by tp*pp*cp = 3*1*1 = 3");
  CHECK_THROWS_WITH(megaplan::derive_data_parallel_size(16, 0, 1, 1),
                    "--tensor-model-parallel-size: must be a positive integer, got 0");
  CHECK_THROWS_WITH(megaplan::derive_data_parallel_size(16, int64_t{1} << 40, int64_t{1} << 40, 1),
                    Contains("overflows 64 bits"));
}

TEST_CASE("vpp follows from layers per virtual stage", "[parallel_plan]") {
  CHECK(megaplan::virtual_pipeline_size_from_layers_per_stage(96, 16, 2) == 3);
  CHECK(megaplan::virtual_pipeline_size_from_layers_per_stage(24, 4, 1) == 6);
  CHECK_THROWS_WITH(
      megaplan::virtual_pipeline_size_from_layers_per_stage(96, 16, 4),
      "--num-layers-per-virtual-pipeline-stage: must divide the 6 layers of each pipeline rank (6 % 4 = 2)");
  CHECK_THROWS_WITH(megaplan::virtual_pipeline_size_from_layers_per_stage(30, 4, 1),
                    "--num-layers: must be divisible by --pipeline-model-parallel-size 4 (30 % 4 = 2)");
}

TEST_CASE("every plan rule has a failing case that names it", "[parallel_plan]") {
  const megaplan::ModelSpec model = model_24_layers();
  CHECK_NOTHROW(megaplan::validate_plan(model, plan_tp2_pp2_dp2()));
  struct Case {
    const char* name;
    void (*mutate)(ParallelPlan&);
    const char* message;
  };
  const Case cases[] = {
      {"zero tp", [](ParallelPlan& p) { p.tensor_parallel_size = 0; },
       "--tensor-model-parallel-size: must be a positive integer, got 0"},
      {"negative pp", [](ParallelPlan& p) { p.pipeline_parallel_size = -1; },
       "--pipeline-model-parallel-size: must be a positive integer"},
      {"zero cp", [](ParallelPlan& p) { p.context_parallel_size = 0; }, "--context-parallel-size: must be a positive"},
      {"zero dp", [](ParallelPlan& p) { p.data_parallel_size = 0; }, "data_parallel_size: must be a positive"},
      {"zero vpp", [](ParallelPlan& p) { p.virtual_pipeline_parallel_size = 0; },
       "--virtual-pipeline-model-parallel-size: must be a positive"},
      {"zero mbs", [](ParallelPlan& p) { p.micro_batch_size = 0; }, "--micro-batch-size: must be a positive"},
      {"zero gbs", [](ParallelPlan& p) { p.global_batch_size = 0; }, "--global-batch-size: must be a positive"},
      {"world overflows", [](ParallelPlan& p) { p.data_parallel_size = int64_t{1} << 62; }, "overflows 64 bits"},
      {"heads % tp", [](ParallelPlan& p) { p.tensor_parallel_size = 3; },
       "--tensor-model-parallel-size: must divide --num-attention-heads 16 (16 % 3 = 1)"},
      {"query groups % tp", [](ParallelPlan& p) { p.tensor_parallel_size = 16; },
       "--tensor-model-parallel-size: must divide --num-query-groups 8 (8 % 16 = 8)"},
      {"layers % (pp*vpp)", [](ParallelPlan& p) { p.pipeline_parallel_size = 5; },
       "--num-layers: 24 must be divisible by pp*vpp = 5*1 = 5; uneven stages"},
      {"layers % (pp*vpp) with vpp",
       [](ParallelPlan& p) {
         p.virtual_pipeline_parallel_size = 5;
         p.schedule = ScheduleKind::kInterleaved;
       },
       "--num-layers: 24 must be divisible by pp*vpp = 2*5 = 10; uneven stages"},
      {"vpp without pp",
       [](ParallelPlan& p) {
         p.pipeline_parallel_size = 1;
         p.virtual_pipeline_parallel_size = 2;
       },
       "--virtual-pipeline-model-parallel-size: needs --pipeline-model-parallel-size > 1"},
      {"gbs % (mbs*dp)", [](ParallelPlan& p) { p.global_batch_size = 18; },
       "--global-batch-size: must be divisible by micro-batch-size*data-parallel-size = 2*2 = 4 (18 % 4 = 2)"},
      {"sp needs tp > 1",
       [](ParallelPlan& p) {
         p.tensor_parallel_size = 1;
         p.sequence_parallel = true;
       },
       "--sequence-parallel: needs --tensor-model-parallel-size > 1"},
      {"sp needs seq/cp % tp",
       [](ParallelPlan& p) {
         p.tensor_parallel_size = 8;
         p.context_parallel_size = 512;
         p.sequence_parallel = true;
       },
       "--sequence-parallel: needs --seq-length/cp = 4 divisible by tp 8 (4 % 8 = 4)"},
      {"cp needs seq % 2cp", [](ParallelPlan& p) { p.context_parallel_size = 3; },
       "--context-parallel-size: needs --seq-length divisible by 2*cp = 6 (2048 % 6 = 2)"},
      {"1f1b needs vpp 1", [](ParallelPlan& p) { p.virtual_pipeline_parallel_size = 2; },
       "--schedule: 1f1b runs one stage per rank; needs vpp = 1, got 2"},
      {"interleaved needs vpp >= 2", [](ParallelPlan& p) { p.schedule = ScheduleKind::kInterleaved; },
       "--virtual-pipeline-model-parallel-size: the interleaved schedule needs vpp >= 2, got 1"},
      {"interleaved needs M >= pp",
       [](ParallelPlan& p) {
         p.schedule = ScheduleKind::kInterleaved;
         p.virtual_pipeline_parallel_size = 2;
         p.pipeline_parallel_size = 4;
         p.data_parallel_size = 1;
         p.global_batch_size = 6;
       },
       "--global-batch-size: the interleaved schedule needs pp <= microbatch group size <= microbatches; got pp 4, "
       "group 4, 3 microbatches"},
      {"V schedules need vpp 2", [](ParallelPlan& p) { p.schedule = ScheduleKind::kZeroBubbleV; },
       "--schedule: zbv places two stages per rank in a V; needs vpp = 2, got 1"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    ParallelPlan plan = plan_tp2_pp2_dp2();
    c.mutate(plan);
    CHECK_THROWS_WITH(megaplan::validate_plan(model, plan), Contains(c.message));
  }
  megaplan::ModelSpec odd_ffn = model;
  odd_ffn.ffn_hidden_size = 1001;
  CHECK_THROWS_WITH(megaplan::validate_plan(odd_ffn, plan_tp2_pp2_dp2()),
                    "--tensor-model-parallel-size: must divide --ffn-hidden-size 1001 (1001 % 2 = 1)");
}

TEST_CASE("expert parallelism: experts to split, ep dividing them and the ranks outside tp", "[parallel_plan]") {
  megaplan::ModelSpec model = model_24_layers();
  ParallelPlan plan = plan_tp2_pp2_dp2();  // 8 GPUs: tp 2, pp 2, dp 2
  plan.expert_model_parallel_size = 2;
  CHECK_THROWS_WITH(megaplan::validate_plan(model, plan),
                    "--expert-model-parallel-size: needs --num-experts (a dense model has no experts to split)");
  model.moe.num_experts = 6;
  CHECK_NOTHROW(megaplan::validate_plan(model, plan));
  plan.expert_model_parallel_size = 4;  // divides no 6 experts
  CHECK_THROWS_WITH(megaplan::validate_plan(model, plan),
                    Contains("--expert-model-parallel-size: must divide --num-experts 6"));
  model.moe.num_experts = 8;  // 4 divides 8 experts, but not cp x dp = 2
  CHECK_THROWS_WITH(megaplan::validate_plan(model, plan),
                    Contains("--expert-model-parallel-size: must divide the ranks of a pipeline stage outside tensor "
                             "parallelism, cp x dp = 2"));
  plan.expert_model_parallel_size = 0;
  CHECK_THROWS_WITH(megaplan::validate_plan(model, plan),
                    "--expert-model-parallel-size: must be a positive integer, got 0");
}

TEST_CASE("expert tensor parallelism: only with experts, etp x ep tiling a stage's ranks, etp dividing the experts",
          "[parallel_plan]") {
  megaplan::ModelSpec model = model_24_layers();
  ParallelPlan plan = plan_tp2_pp2_dp2();  // 8 GPUs: tp 2, pp 2, dp 2
  plan.expert_tensor_parallel_size = 1;
  CHECK_THROWS_WITH(megaplan::validate_plan(model, plan),
                    "--expert-tensor-parallel-size: needs --num-experts (a dense model has no experts to cut)");
  model.moe.num_experts = 8;
  model.moe.ffn_hidden_size = 96;
  CHECK_NOTHROW(megaplan::validate_plan(model, plan));
  CHECK(plan.expert_data_parallel_size() == 4);  // tp x dp = 4 ranks of a stage, each whole experts
  plan.expert_model_parallel_size = 4;           // etp 1 x ep 4 tiles the stage's 4 ranks: the ep group spans tp
  CHECK_NOTHROW(megaplan::validate_plan(model, plan));
  CHECK(plan.expert_data_parallel_size() == 1);
  plan.expert_model_parallel_size = 8;
  CHECK_THROWS_WITH(megaplan::validate_plan(model, plan),
                    Contains("--expert-tensor-parallel-size: times --expert-model-parallel-size must divide the ranks "
                             "of a pipeline stage, tp x cp x dp = 4"));
  plan.expert_model_parallel_size = 1;
  plan.expert_tensor_parallel_size = 4;
  model.moe.ffn_hidden_size = 98;  // etp 4 does not divide it
  CHECK_THROWS_WITH(megaplan::validate_plan(model, plan),
                    Contains("--expert-tensor-parallel-size: must divide --moe-ffn-hidden-size 98"));
  plan.expert_tensor_parallel_size = -1;
  CHECK_THROWS_WITH(megaplan::validate_plan(model, plan),
                    "--expert-tensor-parallel-size: must be a positive integer, got -1");
}

TEST_CASE("the stated MoE imbalance: at least 1, at most experts / top k, only with experts", "[parallel_plan]") {
  megaplan::ModelSpec model = model_24_layers();
  ParallelPlan plan = plan_tp2_pp2_dp2();
  plan.moe_imbalance = 1.5;
  CHECK_THROWS_WITH(megaplan::validate_plan(model, plan),
                    "--moe-imbalance: needs --num-experts (a dense model routes nothing)");
  model.moe.num_experts = 8;  // top 2: the busiest expert takes every token at 4 x the mean
  CHECK_NOTHROW(megaplan::validate_plan(model, plan));
  plan.moe_imbalance = 4.5;
  CHECK_THROWS_WITH(megaplan::validate_plan(model, plan),
                    "--moe-imbalance: must be at most --num-experts / --moe-router-topk = 4 (the busiest expert takes "
                    "each token once at most), got 4.5");
  plan.moe_imbalance = 0.9;
  CHECK_THROWS_WITH(megaplan::validate_plan(model, plan),
                    "--moe-imbalance: must be at least 1 (the busiest expert's rows over the mean), got 0.9");
  plan.moe_imbalance = 1.25;
  const nlohmann::json json = megaplan::parallel_plan_to_json(plan);
  CHECK(json["moe_imbalance"] == 1.25);
  CHECK(megaplan::parallel_plan_from_json(json, "p.json").moe_imbalance == 1.25);
  CHECK_THAT(megaplan::describe_plan(plan), Contains("dp 2, moe imbalance 1.25, vpp 1"));
  CHECK_FALSE(megaplan::parallel_plan_to_json(plan_tp2_pp2_dp2()).contains("moe_imbalance"));
}

TEST_CASE("schedule and recompute spellings round-trip", "[parallel_plan]") {
  for (const char* name : {"gpipe", "1f1b", "interleaved", "zb-h1", "zbv", "dualpipev"}) {
    CHECK(megaplan::to_string(megaplan::parse_schedule_kind(name, "--schedule")) == name);
  }
  for (const char* name : {"none", "selective", "full"}) {
    CHECK(megaplan::to_string(megaplan::parse_recompute_granularity(name, "--recompute-granularity")) == name);
  }
  CHECK_THROWS_WITH(megaplan::parse_schedule_kind("1F1B", "--schedule"),
                    "--schedule: must be one of gpipe, 1f1b, interleaved, zb-h1, zbv, dualpipev; got \"1F1B\"");
  CHECK_THROWS_WITH(megaplan::parse_recompute_granularity("block", "--recompute-granularity"),
                    "--recompute-granularity: must be one of none, selective, full; got \"block\"");
}

TEST_CASE("plan and job JSON round-trip; the job's world must equal its GPUs", "[parallel_plan]") {
  ParallelPlan plan = plan_tp2_pp2_dp2();
  plan.sequence_parallel = true;
  plan.recompute_granularity = megaplan::RecomputeGranularity::kSelective;
  const nlohmann::json json = megaplan::parallel_plan_to_json(plan);
  CHECK(megaplan::parallel_plan_to_json(megaplan::parallel_plan_from_json(json, "p.json")) == json);

  CHECK_FALSE(json.contains("expert_model_parallel_size"));  // dense plans' files as before
  ParallelPlan split_experts = plan;
  split_experts.expert_model_parallel_size = 2;
  const nlohmann::json with_ep = megaplan::parallel_plan_to_json(split_experts);
  CHECK(with_ep["expert_model_parallel_size"] == 2);
  CHECK(megaplan::parallel_plan_from_json(with_ep, "p.json").expert_model_parallel_size == 2);

  megaplan::JobSpec job{model_24_layers(), megaplan::select_gpus(megaplan::cluster_preset("dgx-h100"), 8), plan};
  CHECK_NOTHROW(megaplan::validate_job(job));
  const nlohmann::json job_json = megaplan::job_spec_to_json(job);
  CHECK(megaplan::job_spec_to_json(megaplan::job_spec_from_json(job_json, "j.json")) == job_json);

  job.cluster = megaplan::select_gpus(megaplan::cluster_preset("dgx-h100"), 16);
  CHECK_THROWS_WITH(megaplan::validate_job(job),
                    "--gpus: world size tp*pp*cp*dp = 8 must equal the job's GPU count 16");
  nlohmann::json no_plan = job_json;
  no_plan.erase("plan");
  CHECK_THROWS_WITH(megaplan::job_spec_from_json(no_plan, "j.json"), "j.json: plan: required field is missing");
}
