// action_work: FLOPs of compute actions from the kernel list, bytes of transfers and reductions.
#include <catch2/catch.hpp>

#include <vector>

#include "core/action_work.h"
#include "core/formulas.h"
#include "core/model_presets.h"

using megaplan::ActionKind;

namespace {

megaplan::ParallelPlan plan_of(int64_t tp, int64_t pp, int64_t dp) {
  megaplan::ParallelPlan plan;
  plan.tensor_parallel_size = tp;
  plan.pipeline_parallel_size = pp;
  plan.data_parallel_size = dp;
  plan.micro_batch_size = 2;
  plan.global_batch_size = 8 * dp;
  return plan;
}

}  // namespace

TEST_CASE("a GPT's forward and backward FLOPs by hand", "[core][action_work]") {
  const megaplan::ModelSpec model = megaplan::model_preset("gpt2-124m");
  const megaplan::ParallelPlan plan = plan_of(1, 1, 1);
  const std::vector<megaplan::StageWork> work = megaplan::stage_work(model, plan);
  REQUIRE(work.size() == 1);
  const double tokens = 2.0 * 1024, h = 768, layers = 12, seq = 1024;
  const double vocabulary = static_cast<double>(megaplan::padded_vocab_size(model, 1));
  // QKV 3h^2, projection h^2, fc1 and fc2 4h^2 each; the output layer h x V; causal attention
  // 4 s^2 h / 2 per sequence.
  const double gemms = 2 * tokens * (layers * 12 * h * h + h * vocabulary);
  const double attention = layers * 2 * 2 * seq * seq * h;
  CHECK(work[0].forward_flops == Approx(gemms + attention).epsilon(1e-12));
  CHECK(work[0].backward_flops == Approx(2 * gemms + 2.5 * attention).epsilon(1e-12));
  // I and W split the backward's GEMMs; the attention backward is I's.
  CHECK(work[0].backward_input_flops + work[0].backward_weight_flops == Approx(work[0].backward_flops).epsilon(1e-12));
  CHECK(megaplan::action_work(work, megaplan::forward(0, 3)).flops == work[0].forward_flops);
  CHECK(megaplan::action_work(work, megaplan::make_action(ActionKind::kOptimizer, 0, -1)).flops == 0);
  // No neighbour and no replica: nothing to send or reduce.
  CHECK(work[0].message_bytes == 0);
  CHECK(work[0].gradient_bytes == 0);
}

TEST_CASE("message and gradient bytes of a pipelined, replicated plan", "[core][action_work]") {
  const megaplan::ModelSpec model = megaplan::model_preset("gpt2-124m");
  megaplan::ParallelPlan plan = plan_of(2, 2, 2);
  plan.sequence_parallel = true;
  const std::vector<megaplan::StageWork> work = megaplan::stage_work(model, plan);
  REQUIRE(work.size() == 2);
  // bf16 hidden states of 2 x 1024 tokens, each tp rank sending its sequence shard.
  CHECK(megaplan::action_work(work, megaplan::make_action(ActionKind::kSendForward, 0, 1)).bytes == 2 * 2048 * 768 / 2);
  CHECK(megaplan::action_work(work, megaplan::make_action(ActionKind::kRecvBackward, 0, 1)).bytes ==
        2 * 2048 * 768 / 2);
  // fp32 main gradients of the stage's parameters on one GPU.
  for (int64_t stage = 0; stage < 2; ++stage) {
    CHECK(megaplan::action_work(work, megaplan::make_action(ActionKind::kReduceGrad, stage, -1)).bytes ==
          4 * megaplan::stage_parameters(model, plan, stage).parameters_per_gpu);
  }
  // Tensor parallelism halves the layers' GEMMs and heads: stage 0 (layers and embedding) halves.
  const std::vector<megaplan::StageWork> whole = megaplan::stage_work(model, plan_of(1, 2, 2));
  CHECK(work[0].forward_flops == Approx(whole[0].forward_flops / 2).epsilon(1e-12));
}
