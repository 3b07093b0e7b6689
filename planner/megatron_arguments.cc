// A plan as Megatron-LM arguments; where Megatron-LM lacks the schedule, torchtitan's name for it.
#include "planner/megatron_arguments.h"

#include <cstdint>
#include <string>
#include <utility>

#include "core/moe_spec.h"
#include "core/schedule/schedule_traits.h"
#include "core/units.h"

namespace megaplan::planner {

namespace {

std::string value(const std::string& flag, int64_t number) { return flag + " " + std::to_string(number); }

}  // namespace

std::vector<std::string> megatron_model_arguments(const ModelSpec& model) {
  std::vector<std::string> arguments = {value("--num-layers", model.num_layers),
                                        value("--hidden-size", model.hidden_size),
                                        value("--ffn-hidden-size", model.effective_ffn_hidden_size()),
                                        value("--num-attention-heads", model.num_attention_heads)};
  if (model.effective_num_query_groups() != model.num_attention_heads) {
    arguments.push_back("--group-query-attention");
    arguments.push_back(value("--num-query-groups", model.effective_num_query_groups()));
  }
  if (model.effective_kv_channels() * model.num_attention_heads != model.hidden_size) {
    arguments.push_back(value("--kv-channels", model.effective_kv_channels()));
  }
  arguments.push_back(value("--seq-length", model.seq_length));
  arguments.push_back(value("--max-position-embeddings", model.effective_max_position_embeddings()));
  arguments.push_back("--position-embedding-type " + to_string(model.position_embedding_type));
  if (model.position_embedding_type == PositionEmbedding::kRope) {
    arguments.push_back("--rotary-base " + format_shortest(model.rotary_base));
    if (model.rotary_percent != 1.0) arguments.push_back("--rotary-percent " + format_shortest(model.rotary_percent));
    if (model.rope_scaling.enabled()) {
      arguments.push_back("--use-rope-scaling");
      arguments.push_back("--rope-scaling-factor " + format_shortest(model.rope_scaling.factor));
    }
  }
  arguments.push_back("--normalization " + to_string(model.normalization));
  arguments.push_back("--norm-epsilon " + format_shortest(model.norm_epsilon));
  if (model.swiglu) arguments.push_back("--swiglu");
  if (!model.add_bias_linear) arguments.push_back("--disable-bias-linear");
  if (model.add_qkv_bias) arguments.push_back("--add-qkv-bias");
  if (model.qk_layernorm) arguments.push_back("--qk-layernorm");
  if (model.untie_embeddings_and_output_weights) arguments.push_back("--untie-embeddings-and-output-weights");
  if (model.make_vocab_size_divisible_by != 128) {
    arguments.push_back(value("--make-vocab-size-divisible-by", model.make_vocab_size_divisible_by));
  }
  const MoeSpec& moe = model.moe;
  if (!moe.enabled()) return arguments;
  // The experts and their router, each flag as Megatron-LM takes it back (core/moe_spec.h).
  arguments.push_back(value("--num-experts", moe.num_experts));
  arguments.push_back(value("--moe-ffn-hidden-size", model.effective_moe_ffn_hidden_size()));
  arguments.push_back(value("--moe-router-topk", moe.effective_router_topk()));
  if (moe.layer_freq != 1 || !moe.layer_pattern.empty()) {
    arguments.push_back("--moe-layer-freq " + moe_layer_freq_text(moe));
  }
  if (moe.shared_expert_intermediate_size > 0) {
    arguments.push_back(value("--moe-shared-expert-intermediate-size", moe.shared_expert_intermediate_size));
    if (moe.shared_expert_gate) arguments.push_back("--moe-shared-expert-gate");
  }
  arguments.push_back("--moe-router-score-function " + to_string(moe.score_function));
  if (moe.router_pre_softmax) arguments.push_back("--moe-router-pre-softmax");
  if (moe.router_topk_scaling_factor) {
    arguments.push_back("--moe-router-topk-scaling-factor " + format_shortest(*moe.router_topk_scaling_factor));
  }
  arguments.push_back("--moe-router-load-balancing-type " + to_string(moe.load_balancing));
  arguments.push_back("--moe-aux-loss-coeff " + format_shortest(moe.aux_loss_coeff));
  if (moe.z_loss_coeff > 0) arguments.push_back("--moe-z-loss-coeff " + format_shortest(moe.z_loss_coeff));
  if (moe.router_enable_expert_bias) {
    arguments.push_back("--moe-router-enable-expert-bias");
    arguments.push_back("--moe-router-bias-update-rate " + format_shortest(moe.router_bias_update_rate));
  }
  if (moe.expert_capacity_factor) {
    arguments.push_back("--moe-expert-capacity-factor " + format_shortest(*moe.expert_capacity_factor));
    if (moe.pad_expert_input_to_capacity) arguments.push_back("--moe-pad-expert-input-to-capacity");
    arguments.push_back("--moe-token-drop-policy " + to_string(moe.token_drop_policy));
  }
  arguments.push_back("--moe-token-dispatcher-type " + to_string(moe.token_dispatcher));
  return arguments;
}

std::vector<std::string> megatron_arguments(const ModelSpec& model, const ParallelPlan& plan) {
  std::vector<std::string> arguments = megatron_model_arguments(model);
  arguments.push_back(value("--tensor-model-parallel-size", plan.tensor_parallel_size));
  arguments.push_back(value("--pipeline-model-parallel-size", plan.pipeline_parallel_size));
  if (plan.expert_model_parallel_size > 1) {
    arguments.push_back(value("--expert-model-parallel-size", plan.expert_model_parallel_size));
  }
  if (plan.expert_tensor_parallel() != plan.tensor_parallel_size) {
    arguments.push_back(value("--expert-tensor-parallel-size", plan.expert_tensor_parallel()));
  }
  const PipelineSplit& split = plan.pipeline_split;
  if (plan.virtual_pipeline_parallel_size > 1) {
    // Megatron's layers-per-stage form holds for even stages only; its stage count form for any.
    arguments.push_back(
        split.even() ? value("--num-layers-per-virtual-pipeline-stage", model.num_layers / plan.num_virtual_stages())
                     : value("--num-virtual-stages-per-pipeline-rank", plan.virtual_pipeline_parallel_size));
  }
  if (split.first_stage_layers > 0)
    arguments.push_back(value("--decoder-first-pipeline-num-layers", split.first_stage_layers));
  if (split.last_stage_layers > 0)
    arguments.push_back(value("--decoder-last-pipeline-num-layers", split.last_stage_layers));
  if (split.account_for_embedding) arguments.push_back("--account-for-embedding-in-pipeline-split");
  if (split.account_for_loss) arguments.push_back("--account-for-loss-in-pipeline-split");
  const bool context_parallel = plan.context_parallel_size > 1;
  if (context_parallel) {
    // Megatron-Core's ring over send and receive, the one megaplan simulates and runs
    // (core/context_parallel.h).
    arguments.push_back(value("--context-parallel-size", plan.context_parallel_size));
    arguments.push_back("--cp-comm-type p2p");
  }
  arguments.push_back(value("--micro-batch-size", plan.micro_batch_size));
  arguments.push_back(value("--global-batch-size", plan.global_batch_size));
  if (plan.sequence_parallel) arguments.push_back("--sequence-parallel");
  if (plan.use_distributed_optimizer) arguments.push_back("--use-distributed-optimizer");
  if (overlaps_gradient_reduction(plan) && plan.options.ddp_impl == DdpImpl::kLocal) {
    arguments.push_back("--overlap-grad-reduce");
  }
  // What the simulation assumed the code does (core/implementation_options.h), where it takes effect.
  const ImplementationOptions& options = plan.options;
  arguments.push_back(options.precision == DType::kFloat16 ? "--fp16" : "--bf16");
  // Megatron-LM runs context parallelism in Transformer Engine's attention only.
  const TransformerImpl transformer_impl =
      context_parallel ? TransformerImpl::kTransformerEngine : options.transformer_impl;
  arguments.push_back("--transformer-impl " + to_string(transformer_impl));
  if (transformer_impl == TransformerImpl::kLocal && options.use_flash_attn) arguments.push_back("--use-flash-attn");
  arguments.push_back("--attention-dropout " + format_shortest(options.attention_dropout));
  arguments.push_back("--hidden-dropout " + format_shortest(options.hidden_dropout));
  const std::pair<bool, const char*> off[] = {
      {!fused_attention(options) && !options.masked_softmax_fusion, "--no-masked-softmax-fusion"},
      {!options.bias_gelu_fusion, "--no-bias-gelu-fusion"},
      {!options.bias_dropout_fusion, "--no-bias-dropout-fusion"},
      {!options.gradient_accumulation_fusion, "--no-gradient-accumulation-fusion"},
      {options.precision == DType::kFloat16 && options.accumulate_allreduce_grads_in_fp32,
       "--accumulate-allreduce-grads-in-fp32"},
      {overlaps_parameter_gather(plan), "--overlap-param-gather"},
      {overlaps_tensor_parallel_communication(plan), "--tp-comm-overlap"},
      {plan.pipeline_parallel_size > 1 && plan.tensor_parallel_size > 1 && !plan.sequence_parallel &&
           !options.scatter_gather_tensors_in_pipeline,
       "--no-scatter-gather-tensors-in-pipeline"},
      {options.ddp_impl == DdpImpl::kTorch, "--DDP-impl torch"}};
  for (const auto& [given, flag] : off) {
    if (given) arguments.push_back(flag);
  }
  switch (plan.recompute_granularity) {
    case RecomputeGranularity::kNone: break;
    case RecomputeGranularity::kSelective: arguments.push_back("--recompute-granularity selective"); break;
    case RecomputeGranularity::kFull:
      arguments.push_back("--recompute-granularity full");
      arguments.push_back("--recompute-method " + to_string(plan.recompute_method));
      arguments.push_back("--recompute-num-layers " + std::to_string(plan.recompute_num_layers));
      break;
  }
  // Megatron-LM takes the vocabulary from the tokenizer; --vocab-size is read with the
  // NullTokenizer (mock data) only.
  arguments.push_back("# the vocabulary (" + std::to_string(model.vocab_size) +
                      " tokens) comes from your --tokenizer-type and its files; with --tokenizer-type NullTokenizer: "
                      "--vocab-size " +
                      std::to_string(model.vocab_size));
  // Megatron-LM's own schedules are chosen by the pipeline and virtual-pipeline sizes above; for the
  // others, torch.distributed.pipelining's class name, which torchtitan's setting takes.
  const ScheduleTraits& schedule = schedule_traits(plan.schedule);
  if (!schedule.megatron_native) {
    arguments.push_back("# " + std::string(schedule.spelling) + " is not a Megatron-LM schedule; in torchtitan: " +
                        "--parallelism.pipeline_parallel_schedule " + schedule.torch_schedule);
  }
  return arguments;
}

std::string format_megatron_arguments(const std::vector<std::string>& arguments) {
  std::string line;
  std::string notes;
  for (const std::string& argument : arguments) {
    if (argument.rfind('#', 0) == 0) {
      notes += argument + "\n";
    } else {
      line += (line.empty() ? "" : " ") + argument;
    }
  }
  return line + "\n" + notes;
}

}  // namespace megaplan::planner
