// Shared option groups: their CLI11 flags, and which of them a command line gave.
#include "cli/shared_options.h"

#include <algorithm>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace megaplan::cli {

void add_model_options(CLI::App& command, ModelOptions& options) {
  const std::string group = "Model (Megatron-LM flags override the preset's fields)";
  command
      .add_option("--model", options.model,
                  "Preset name, megaplan model .json, or Hugging Face config.json (default: Megatron's model flags "
                  "define a model named custom; with none given, " +
                      std::string(kDefaultModel) +
                      " where a command "
                      "has a default)")
      ->group(group);
  command.add_option("--num-layers", options.num_layers, "Transformer layers")->group(group);
  command.add_option("--hidden-size", options.hidden_size, "Hidden size h")->group(group);
  command
      .add_option("--ffn-hidden-size", options.ffn_hidden_size, "MLP hidden size (default 4h; 2/3 of it with SwiGLU)")
      ->group(group);
  command.add_option("--num-attention-heads", options.num_attention_heads, "Attention heads")->group(group);
  command.add_option("--num-query-groups", options.num_query_groups, "Key/value groups (GQA); default one per head")
      ->group(group);
  command
      .add_flag("--group-query-attention", options.group_query_attention,
                "Grouped-query attention (Megatron's flag): --num-query-groups groups, 1 when not given")
      ->group(group);
  command.add_option("--kv-channels", options.kv_channels, "Head dimension (default h / heads)")->group(group);
  command.add_option("--seq-length", options.seq_length, "Training sequence length")->group(group);
  command.add_option("--max-position-embeddings", options.max_position_embeddings, "Position table size")->group(group);
  command.add_option("--vocab-size", options.vocab_size, "Tokenizer vocabulary (padded as Megatron pads it)")
      ->group(group);
  command
      .add_option("--make-vocab-size-divisible-by", options.make_vocab_size_divisible_by,
                  "Vocabulary padding multiple (times tp); default 128")
      ->group(group);
  command.add_flag("--swiglu", options.swiglu, "SwiGLU MLP")->group(group);
  command.add_option("--normalization", options.normalization, "LayerNorm or RMSNorm")->group(group);
  command.add_option("--position-embedding-type", options.position_embedding_type, "learned_absolute or rope")
      ->group(group);
  command.add_option("--norm-epsilon", options.norm_epsilon, "The norms' epsilon (default 1e-5)")->group(group);
  command.add_option("--rotary-base", options.rotary_base, "RoPE's theta (default 10000)")->group(group);
  command
      .add_option("--rotary-percent", options.rotary_percent,
                  "Share of each head's dimensions RoPE rotates (default 1.0)")
      ->group(group);
  command
      .add_flag("--use-rope-scaling,--rope-scaling", options.use_rope_scaling,
                "Llama 3.1's RoPE scaling (low/high frequency factors 1 and 4 over 8192 positions)")
      ->group(group);
  command
      .add_option("--rope-scaling-factor", options.rope_scaling_factor,
                  "With --use-rope-scaling: the factor (default 8)")
      ->group(group);
  command
      .add_flag("--untie-embeddings-and-output-weights", options.untie_embeddings_and_output_weights,
                "Separate output layer weights")
      ->group(group);
  command.add_flag("--disable-bias-linear", options.disable_bias_linear, "No biases in linear layers")->group(group);
  command.add_flag("--add-qkv-bias", options.add_qkv_bias, "QKV bias even with --disable-bias-linear")->group(group);
  command
      .add_flag("--qk-layernorm", options.qk_layernorm,
                "Normalise each query and key head (RMSNorm over head_dim) before RoPE, as Qwen3")
      ->group(group);
  command.add_option("--num-experts", options.num_experts, "Mixture of experts: N experts in each MoE layer")
      ->group(group);
  command.add_option("--moe-ffn-hidden-size", options.moe_ffn_hidden_size, "Each expert's width (default the MLP's)")
      ->group(group);
  command.add_option("--moe-router-topk", options.moe_router_topk, "Experts each token is routed to (default 2)")
      ->group(group);
  command
      .add_option("--moe-shared-expert-intermediate-size", options.moe_shared_expert_intermediate_size,
                  "A shared expert of this width (default none)")
      ->group(group);
  command.add_flag("--moe-shared-expert-gate", options.moe_shared_expert_gate, "A sigmoid gate on the shared expert")
      ->group(group);
  command
      .add_option("--moe-layer-freq", options.moe_layer_freq,
                  "Experts every N-th layer from layer 0, or a pattern such as ([1]*3+[0])*2 (default 1)")
      ->group(group);
  command.add_option("--moe-router-score-function", options.moe_router_score_function, "softmax (default) or sigmoid")
      ->group(group);
  command.add_flag("--moe-router-pre-softmax", options.moe_router_pre_softmax, "Scores over every expert, then top k")
      ->group(group);
  command
      .add_option("--moe-router-topk-scaling-factor", options.moe_router_topk_scaling_factor,
                  "Scales the chosen experts' probabilities (default none)")
      ->group(group);
  command
      .add_option("--moe-router-load-balancing-type", options.moe_router_load_balancing_type,
                  "aux_loss (default), seq_aux_loss or none")
      ->group(group);
  command
      .add_option("--moe-aux-loss-coeff", options.moe_aux_loss_coeff, "The load-balancing loss's weight (default 0)")
      ->group(group);
  command.add_option("--moe-z-loss-coeff", options.moe_z_loss_coeff, "The router's z loss weight (default 0)")
      ->group(group);
  command
      .add_flag("--moe-router-enable-expert-bias", options.moe_router_enable_expert_bias,
                "Aux-loss-free balancing: an expert bias on the sigmoid scores")
      ->group(group);
  command
      .add_option("--moe-router-bias-update-rate", options.moe_router_bias_update_rate,
                  "The expert bias's step per global batch (default 0.001)")
      ->group(group);
  command
      .add_option("--moe-expert-capacity-factor", options.moe_expert_capacity_factor,
                  "Each expert's capacity over an even share of the routes (default: dropless)")
      ->group(group);
  command
      .add_flag("--moe-pad-expert-input-to-capacity", options.moe_pad_expert_input_to_capacity,
                "Every expert computes exactly its capacity")
      ->group(group);
  command
      .add_option("--moe-token-drop-policy", options.moe_token_drop_policy,
                  "Over capacity keep the most probable routes (probs, default) or the earliest (position)")
      ->group(group);
  command
      .add_option("--moe-token-dispatcher-type", options.moe_token_dispatcher_type,
                  "Tokens to their experts' ranks by alltoall (default), allgather or flex")
      ->group(group);
}

void add_cluster_options(CLI::App& command, ClusterOptions& options) {
  const std::string group = "Cluster";
  command.add_option("--cluster", options.cluster, "Preset name or cluster .json")->capture_default_str()->group(group);
  command
      .add_option("--gpus", options.gpus,
                  "GPUs to use: whole nodes, or part of one node (default: a one-node cluster's GPUs)")
      ->group(group);
}

void add_plan_options(CLI::App& command, PlanOptions& options) {
  const std::string group = "Parallel plan (Megatron-LM flags)";
  command.add_option("--tp,--tensor-model-parallel-size", options.tensor_parallel_size, "Tensor parallel size")
      ->capture_default_str()
      ->group(group);
  command.add_option("--pp,--pipeline-model-parallel-size", options.pipeline_parallel_size, "Pipeline parallel size")
      ->capture_default_str()
      ->group(group);
  command.add_option("--cp,--context-parallel-size", options.context_parallel_size, "Context parallel size")
      ->capture_default_str()
      ->group(group);
  command
      .add_option("--ep,--expert-model-parallel-size", options.expert_model_parallel_size,
                  "Expert parallel size: each layer's experts split over ep ranks (models with experts)")
      ->capture_default_str()
      ->group(group);
  command
      .add_option("--etp,--expert-tensor-parallel-size", options.expert_tensor_parallel_size,
                  "Expert tensor parallel size: each expert cut over tp ranks (models with experts; must be tp, "
                  "Megatron's default)")
      ->group(group);
  command
      .add_option("--moe-imbalance", options.moe_imbalance,
                  "The routed load the costs assume: the busiest expert's rows over the mean, as train logs it "
                  "(tokens_per_expert_max_mean); 1 is balanced")
      ->capture_default_str()
      ->group(group);
  command
      .add_option("--vpp,--virtual-pipeline-model-parallel-size,--num-virtual-stages-per-pipeline-rank",
                  options.virtual_pipeline_parallel_size, "Model chunks per pipeline rank")
      ->group(group);
  command
      .add_option("--num-layers-per-virtual-pipeline-stage", options.layers_per_virtual_stage,
                  "Layers per model chunk (sets vpp)")
      ->group(group);
  command
      .add_option("--decoder-first-pipeline-num-layers", options.pipeline_split.first_stage_layers,
                  "Layers of the first pipeline rank (uneven stages; the other ranks share the rest)")
      ->group(group);
  command
      .add_option("--decoder-last-pipeline-num-layers", options.pipeline_split.last_stage_layers,
                  "Layers of the last pipeline rank (uneven stages)")
      ->group(group);
  command
      .add_flag("--account-for-embedding-in-pipeline-split", options.pipeline_split.account_for_embedding,
                "Count the input embedding as a layer: the first stage holds one layer fewer")
      ->group(group);
  command
      .add_flag("--account-for-loss-in-pipeline-split", options.pipeline_split.account_for_loss,
                "Count the loss as a layer: the last stage holds one layer fewer")
      ->group(group);
  command.add_option("--mbs,--micro-batch-size", options.micro_batch_size, "Micro-batch size")
      ->capture_default_str()
      ->group(group);
  command.add_option("--gbs,--global-batch-size", options.global_batch_size, "Global batch size (default mbs * dp)")
      ->group(group);
  command.add_flag("--sequence-parallel", options.sequence_parallel, "Sequence parallelism (needs tp > 1)")
      ->group(group);
  command.add_flag("--use-distributed-optimizer", options.use_distributed_optimizer, "Shard optimizer state over dp")
      ->group(group);
  command.add_option("--recompute-granularity", options.recompute_granularity, "none, selective or full")
      ->capture_default_str()
      ->group(group);
  command
      .add_flag("--recompute-activations", options.recompute_activations,
                "Megatron's alias of --recompute-granularity selective (it wins over that flag, as in Megatron)")
      ->group(group);
  command
      .add_option("--recompute-method", options.recompute_method,
                  "With full: uniform (groups of N layers) or block (the first N layers of each chunk)")
      ->group(group);
  command.add_option("--recompute-num-layers", options.recompute_num_layers, "With full: N (default 1)")->group(group);
  command
      .add_option("--schedule", options.schedule,
                  "gpipe, 1f1b, interleaved, zb-h1, zbv, dualpipev (default: interleaved when vpp > 1, else 1f1b)")
      ->group(group);
  add_implementation_options(command, options.implementation);
}

void add_implementation_options(CLI::App& command, ImplementationFlags& flags) {
  const std::string group = "Implementation (Megatron-LM flags; defaults by --implementation)";
  command
      .add_option("--implementation", flags.implementation,
                  "Whose training code runs the plan: megaplan (its executor), megatron-core (Transformer Engine, "
                  "bf16, every overlap) or megatron-local (legacy: fp16, unfused attention, local DDP)")
      ->capture_default_str()
      ->group(group);
  CLI::Option* fp16 = command.add_flag("--fp16", flags.fp16, "fp16 with loss scaling")->group(group);
  command.add_flag("--bf16", flags.bf16, "bf16")->excludes(fp16)->group(group);
  command.add_option("--transformer-impl", flags.transformer_impl, "local or transformer_engine")->group(group);
  command.add_option("--DDP-impl", flags.ddp_impl, "megatron-local's data parallelism: local (default) or torch")
      ->group(group);
  command.add_flag("--use-flash-attn", flags.use_flash_attn, "Flash attention in the local transformer")->group(group);
  command.add_option("--attention-dropout", flags.attention_dropout, "Dropout on attention probabilities")
      ->group(group);
  command.add_option("--hidden-dropout", flags.hidden_dropout, "Dropout on the residual branches")->group(group);
  command.add_flag("--no-masked-softmax-fusion", flags.no_masked_softmax_fusion, "Unfused mask and softmax")
      ->group(group);
  command.add_flag("--no-bias-gelu-fusion", flags.no_bias_gelu_fusion, "Bias add and GELU apart")->group(group);
  command.add_flag("--no-bias-dropout-fusion", flags.no_bias_dropout_fusion, "Bias, dropout and residual add apart")
      ->group(group);
  command
      .add_flag("--no-gradient-accumulation-fusion", flags.no_gradient_accumulation_fusion,
                "Weight gradients added into the main gradients by a kernel of their own")
      ->group(group);
  command
      .add_flag("--accumulate-allreduce-grads-in-fp32", flags.accumulate_allreduce_grads_in_fp32,
                "fp32 main gradients with --fp16")
      ->group(group);
  command.add_flag("--overlap-grad-reduce", flags.overlap_grad_reduce, "Reduce gradient buckets during the backward")
      ->group(group);
  command
      .add_flag("--overlap-param-gather", flags.overlap_param_gather,
                "Gather the distributed optimizer's parameters during the next forward")
      ->group(group);
  command
      .add_flag("--tp-comm-overlap", flags.tp_comm_overlap,
                "Overlap tp collectives with GEMMs (with --sequence-parallel)")
      ->group(group);
  command
      .add_flag("--no-scatter-gather-tensors-in-pipeline", flags.no_scatter_gather_tensors_in_pipeline,
                "Send whole activations between stages")
      ->group(group);
}

GivenFlags given_flags(const CLI::App& command) {
  GivenFlags given;
  for (const CLI::Option* option : command.get_options()) {
    const std::string& group = option->get_group();
    const bool job_flag = group.rfind("Model", 0) == 0 || group == "Cluster" || group.rfind("Parallel", 0) == 0 ||
                          group.rfind("Implementation", 0) == 0;
    if (job_flag && option->count() > 0 && !option->get_lnames().empty()) {
      // Its Megatron spelling: the longest of its names.
      const std::vector<std::string>& names = option->get_lnames();
      given["--" + *std::max_element(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
              return a.size() < b.size();
            })] = group;
    }
  }
  return given;
}
}  // namespace megaplan::cli
