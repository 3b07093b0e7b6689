// What megaplan's executor refuses (core/executor_support.h): a model with experts trains where the
// MoE MLP runs (SwiGLU experts without biases, tp, cp and ep 1, no full recomputation, no schedule
// splitting the backward), and each other case names its flag.
#include <catch2/catch.hpp>

#include <algorithm>

#include <optional>
#include <string>

#include "core/executor_support.h"
#include "core/layer_recipe.h"

namespace {

megaplan::ModelSpec moe_llama() {
  megaplan::ModelSpec model;
  model.name = "moe-llama";
  model.num_layers = 4;
  model.hidden_size = 32;
  model.num_attention_heads = 4;
  model.seq_length = 16;
  model.vocab_size = 64;
  model.swiglu = true;
  model.normalization = megaplan::Normalization::kRMSNorm;
  model.position_embedding_type = megaplan::PositionEmbedding::kRope;
  model.add_bias_linear = false;
  model.moe.num_experts = 4;
  model.moe.router_topk = 2;
  model.moe.ffn_hidden_size = 24;
  return model;
}

std::string flag_of(const std::optional<megaplan::SpecError>& refusal) { return refusal ? refusal->field() : ""; }

}  // namespace

TEST_CASE("the executor trains MoE layers where the MoE MLP runs, and names the flag of the rest", "[core][moe]") {
  using megaplan::executor_model_refusal;
  using megaplan::executor_moe_refusal;
  const megaplan::ModelSpec model = moe_llama();
  megaplan::ParallelPlan plan;
  plan.micro_batch_size = 2;
  plan.global_batch_size = 8;
  CHECK_FALSE(executor_model_refusal(model));
  CHECK_FALSE(executor_moe_refusal(model, plan));

  megaplan::ModelSpec gelu = model;
  gelu.swiglu = false;
  gelu.add_bias_linear = true;
  CHECK(flag_of(executor_model_refusal(gelu)) == "--swiglu");
  megaplan::ModelSpec biased = model;
  biased.add_bias_linear = true;
  CHECK(flag_of(executor_model_refusal(biased)) == "--disable-bias-linear");
  megaplan::ModelSpec expert_bias = model;
  expert_bias.moe.score_function = megaplan::RouterScoreFunction::kSigmoid;
  expert_bias.moe.router_enable_expert_bias = true;
  CHECK_FALSE(executor_model_refusal(expert_bias));  // aux-loss-free balancing trains

  const auto refused = [&](megaplan::ParallelPlan changed) { return flag_of(executor_moe_refusal(model, changed)); };
  megaplan::ParallelPlan changed = plan;
  changed.tensor_parallel_size = 2;
  CHECK(refused(changed) == "--sequence-parallel");  // each tp rank routes its own rows of the stream
  changed.sequence_parallel = true;
  CHECK(refused(changed).empty());
  megaplan::ModelSpec by_sequence = model;
  by_sequence.moe.load_balancing = megaplan::LoadBalancing::kSeqAuxLoss;
  by_sequence.moe.aux_loss_coeff = 0.01;
  CHECK_FALSE(executor_moe_refusal(by_sequence, changed));  // mbs 2 over tp 2: a whole sequence a rank
  changed.micro_batch_size = 1;
  CHECK(flag_of(executor_moe_refusal(by_sequence, changed)) == "--moe-router-load-balancing-type");
  changed.micro_batch_size = 2;
  changed.options.tp_comm_overlap = true;
  changed.options.transformer_impl = megaplan::TransformerImpl::kTransformerEngine;
  CHECK(refused(changed) == "--tp-comm-overlap");
  changed = plan;
  changed.context_parallel_size = 2;  // each cp rank routes its own tokens
  CHECK(refused(changed).empty());
  CHECK(flag_of(executor_moe_refusal(by_sequence, changed)) == "--moe-router-load-balancing-type");
  changed = plan;
  changed.data_parallel_size = 2;
  changed.expert_model_parallel_size = 2;  // trains
  CHECK(refused(changed).empty());
  changed = plan;
  changed.recompute_granularity = megaplan::RecomputeGranularity::kFull;  // the MoE layers' forward again
  CHECK(refused(changed).empty());
  changed = plan;
  changed.pipeline_parallel_size = 2;
  changed.virtual_pipeline_parallel_size = 2;
  for (const megaplan::ScheduleKind schedule :
       {megaplan::ScheduleKind::kZeroBubbleV, megaplan::ScheduleKind::kDualPipeV,
        megaplan::ScheduleKind::kInterleaved}) {
    changed.schedule = schedule;  // the split backward's I and W too
    CHECK(refused(changed).empty());
  }
  // A dense model is never an MoE refusal, whatever the layout.
  megaplan::ModelSpec dense = model;
  dense.moe = {};
  changed = plan;
  changed.tensor_parallel_size = 2;
  CHECK_FALSE(executor_moe_refusal(dense, changed));
}

TEST_CASE("the recipe sizes an MoE layer's buffers by its rows: every route dropless, the capacity with one",
          "[core][moe]") {
  megaplan::ModelSpec model = moe_llama();
  megaplan::ParallelPlan plan;
  plan.micro_batch_size = 2;
  plan.global_batch_size = 8;
  const megaplan::LayerRecipe dropless(model, plan);
  REQUIRE(dropless.moe);
  CHECK(dropless.moe->tokens == 32);
  CHECK(dropless.moe->most_rows == 64);      // 32 tokens x top 2
  CHECK(dropless.moe->expert_rows() == 64);  // ep 1: the rank's experts compute every row it dispatches
  CHECK(megaplan::moe_expert_kept(*dropless.moe).fc1_out.count == 64 * 2 * 24);
  CHECK(megaplan::moe_scratch(*dropless.moe).sent.count == 0);  // nothing leaves the rank
  plan.data_parallel_size = 2;
  plan.expert_model_parallel_size = 2;  // balanced: as many rows arrive as leave
  const megaplan::LayerRecipe split(model, plan);
  CHECK(split.moe->experts == 4);
  CHECK(split.moe->local_experts() == 2);
  CHECK(split.moe->expert_rows() == 64);
  CHECK(megaplan::moe_scratch(*split.moe).sent.count == 64 * split.moe->hidden);
  CHECK(megaplan::moe_scratch(*split.moe).counts.count == 2 * 4);
  CHECK(megaplan::moe_expert_scratch(*split.moe).exchanged.count == 64 * split.moe->hidden);
  CHECK(megaplan::moe_expert_rows(65, 64) == 68);  // rounded up to a sixteenth of the most rows
  CHECK(megaplan::moe_expert_rows(64, 64) == 64);
  CHECK(megaplan::moe_expert_rows(10, 64) == 64);  // never fewer than the balanced load's
  plan.data_parallel_size = 1;
  plan.expert_model_parallel_size = 1;
  CHECK(dropless.kept(megaplan::LayerKeep::kAll, true).fc1.count == 0);  // no dense MLP buffers
  CHECK(dropless.kept(megaplan::LayerKeep::kAll, false).fc1.count > 0);
  model.moe.expert_capacity_factor = 0.5;  // ceil(64 / 4 x 0.5) = 8 an expert, 32 in all
  CHECK(megaplan::LayerRecipe(model, plan).moe->most_rows == 32);
  model.moe.expert_capacity_factor = 3.0;  // 48 an expert: no more rows than routes
  CHECK(megaplan::LayerRecipe(model, plan).moe->most_rows == 64);
  model.moe.pad_expert_input_to_capacity = true;  // padded to 48 each
  CHECK(megaplan::LayerRecipe(model, plan).moe->most_rows == 4 * 48);
  // Its kernel blocks list the MoE layers apart (core/moe_kernel_list.h), padded rows permuted.
  const megaplan::KernelBlocks blocks = megaplan::LayerRecipe(model, plan).kernel_blocks(0, {});
  const std::vector<megaplan::Kernel>& moe_forward =
      blocks[static_cast<std::size_t>(megaplan::KernelBlock::kMoeLayerForward)];
  CHECK(std::count(moe_forward.begin(), moe_forward.end(),
                   megaplan::row_kernel(megaplan::KernelKind::kMoePermute, 4 * 48, model.hidden_size)) == 1);
}
