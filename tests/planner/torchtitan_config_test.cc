// search --emit torchtitan's module: which registry config and flavour a model maps to, and the
// plans torchtitan cannot run refused. (tests/cli/check_torchtitan_config.py runs the module
// against torchtitan's config fields.)
#include <catch2/catch.hpp>

#include <string>

#include "core/error.h"
#include "core/model_presets.h"
#include "planner/torchtitan_config.h"

namespace {

using megaplan::ModelSpec;
using megaplan::ParallelPlan;
using megaplan::planner::torchtitan_config;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

ParallelPlan plan_of(int64_t tp, int64_t dp, int64_t ep = 1, int64_t etp = 0) {
  ParallelPlan plan;
  plan.tensor_parallel_size = tp;
  plan.data_parallel_size = dp;
  plan.sequence_parallel = tp > 1;
  plan.expert_model_parallel_size = ep;
  plan.expert_tensor_parallel_size = etp;
  plan.use_distributed_optimizer = true;
  plan.micro_batch_size = 1;
  plan.global_batch_size = 8 * dp;
  return plan;
}

std::string refusal(const ModelSpec& model, const ParallelPlan& plan) {
  try {
    torchtitan_config(model, plan);
  } catch (const megaplan::SpecError& error) {
    return error.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a preset maps to its torchtitan flavour only while it has the preset's shape", "[planner]") {
  ModelSpec llama = megaplan::model_preset("llama3-70b");
  std::string text = torchtitan_config(llama, plan_of(8, 2));
  CHECK(has(text, "from torchtitan.models.llama3.config_registry import llama3_70b\n"));
  CHECK(has(text, "    config = llama3_70b()\n"));
  CHECK_FALSE(has(text, "model_spec"));
  llama.seq_length = 4096;  // the run's, not the shape's
  CHECK_FALSE(has(torchtitan_config(llama, plan_of(8, 2)), "model_spec"));
  llama.num_layers = 40;
  text = torchtitan_config(llama, plan_of(8, 2));
  CHECK(has(text, "# torchtitan has no flavour of llama3-70b: add one to llama3_configs"));
  CHECK(has(text, "    config.model_spec = model_registry(\"llama3-70b\")\n"));
  CHECK(has(text, "    config.loss.loss_fn.global_vocab_size = decoder_vocab_size(config.model_spec)\n"));

  // A flavour without a registry config of its own: the kind's base, its model_spec replaced.
  text = torchtitan_config(megaplan::model_preset("qwen3-8b"), plan_of(2, 4));
  CHECK(has(text, "    config = qwen3_32b()\n    config.model_spec = model_registry(\"8B\")\n"));
}

TEST_CASE("an MoE plan carries its ep; the router torchtitan runs otherwise is said", "[planner]") {
  ModelSpec qwen = megaplan::model_preset("qwen3-30b-a3b");
  std::string text = torchtitan_config(qwen, plan_of(2, 8, 4, 1));
  CHECK(has(text, "    config = qwen3_30b_a3b()\n"));
  CHECK(has(text, "    config.parallelism.expert_parallel_degree = 4\n"));
  CHECK(has(text, "this model's balancing: none\n"));
  qwen.moe.router_enable_expert_bias = true;
  qwen.moe.score_function = megaplan::RouterScoreFunction::kSigmoid;
  CHECK_FALSE(has(torchtitan_config(qwen, plan_of(2, 8, 4, 1)), "balancing"));
  qwen.moe.aux_loss_coeff = 0.01;
  CHECK(has(torchtitan_config(qwen, plan_of(2, 8, 4, 1)),
            "this model's balancing: aux_loss at 0.01, an expert bias at rate 0.001\n"));
}

TEST_CASE("what torchtitan cannot run is refused naming the flag", "[planner]") {
  const ModelSpec qwen = megaplan::model_preset("qwen3-30b-a3b");
  CHECK(has(refusal(qwen, plan_of(2, 8, 2, 2)), "(search with --etp 1)"));
  CHECK(has(refusal(qwen, plan_of(2, 8, 1, 1)), "(search with --etp 2)"));
  ParallelPlan replicated = plan_of(1, 8, 4, 1);
  replicated.use_distributed_optimizer = false;  // the ep group would span data-parallel replicas
  CHECK(has(refusal(qwen, replicated), "which ep 4 must divide (search with --use-distributed-optimizer)"));
  ParallelPlan fp16 = plan_of(2, 4);
  fp16.options.precision = megaplan::DType::kFloat16;
  CHECK(has(refusal(megaplan::model_preset("llama3-8b"), fp16), "precision is fp16"));
  CHECK(has(refusal(megaplan::model_preset("mixtral-8x7b"), plan_of(1, 8)), "no model of mixtral-8x7b's kind"));
  CHECK(refusal(qwen, plan_of(2, 8, 4, 1)).empty());
}
