// The job's options as Megatron-LM's flags state them (model, cluster, plan and implementation
// flags, each set only when given) and the rules that turn them into core's specs: the model from
// a preset or a file or the flags alone, the GPUs, the plan with dp derived, a job file with flags
// over it. cli/shared_options.h binds the flags to these structs.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "core/job_spec.h"

namespace megaplan {

// `--model NAME|FILE` plus Megatron's model flags; an explicit flag overrides the preset's field.
// Without --model, Megatron's model flags alone define a model named "custom" with Megatron-LM's
// argparse defaults (as pretrain_gpt.py does); with neither, the command's default model.
struct ModelOptions {
  std::optional<std::string> model;
  std::optional<int64_t> num_layers, hidden_size, ffn_hidden_size, num_attention_heads, num_query_groups, kv_channels,
      seq_length, max_position_embeddings, vocab_size, make_vocab_size_divisible_by;
  std::optional<std::string> normalization, position_embedding_type;
  std::optional<double> norm_epsilon, rotary_base, rotary_percent, rope_scaling_factor;
  // Mixture of experts (ModelSpec::moe, core/moe_spec.h): described and trained, not yet costed (issue 40).
  std::optional<int64_t> num_experts, moe_ffn_hidden_size, moe_router_topk, moe_shared_expert_intermediate_size;
  std::optional<std::string> moe_layer_freq, moe_router_score_function, moe_router_load_balancing_type,
      moe_token_drop_policy, moe_token_dispatcher_type;
  std::optional<double> moe_router_topk_scaling_factor, moe_aux_loss_coeff, moe_z_loss_coeff,
      moe_router_bias_update_rate, moe_expert_capacity_factor;
  bool moe_shared_expert_gate = false, moe_router_pre_softmax = false, moe_router_enable_expert_bias = false,
       moe_pad_expert_input_to_capacity = false;
  bool swiglu = false;
  bool group_query_attention = false;
  bool use_rope_scaling = false;
  bool untie_embeddings_and_output_weights = false;
  bool disable_bias_linear = false;
  bool add_qkv_bias = false;
  bool qk_layernorm = false;
};

struct ClusterOptions {
  std::string cluster = "dgx-a100-80gb";
  std::optional<int64_t> gpus;  // default: the whole cluster when it is one node
};

// --implementation and the Megatron-LM flags that say what its code does (implementation_options.h).
struct ImplementationFlags {
  std::string implementation = "megaplan";
  bool fp16 = false, bf16 = false;
  std::optional<std::string> transformer_impl, ddp_impl;
  bool use_flash_attn = false;
  std::optional<double> attention_dropout, hidden_dropout;
  bool no_masked_softmax_fusion = false, no_bias_gelu_fusion = false, no_bias_dropout_fusion = false,
       no_gradient_accumulation_fusion = false, accumulate_allreduce_grads_in_fp32 = false, overlap_grad_reduce = false,
       overlap_param_gather = false, tp_comm_overlap = false, no_scatter_gather_tensors_in_pipeline = false;
};

struct PlanOptions {
  int64_t tensor_parallel_size = 1;
  int64_t pipeline_parallel_size = 1;
  int64_t context_parallel_size = 1;
  int64_t expert_model_parallel_size = 1;
  // --expert-tensor-parallel-size: megaplan cuts the experts over the tp group (Megatron's default);
  // given, it must be tp.
  std::optional<int64_t> expert_tensor_parallel_size;
  double moe_imbalance = 1.0;  // --moe-imbalance (ParallelPlan::moe_imbalance)
  std::optional<int64_t> virtual_pipeline_parallel_size;
  std::optional<int64_t> layers_per_virtual_stage;
  PipelineSplit pipeline_split;  // --decoder-first/last-pipeline-num-layers, --account-for-*
  int64_t micro_batch_size = 1;
  std::optional<int64_t> global_batch_size;  // default: one microbatch per data-parallel replica
  bool sequence_parallel = false;
  bool use_distributed_optimizer = false;
  std::string recompute_granularity = "none";
  bool recompute_activations = false;           // Megatron's alias: --recompute-granularity selective
  std::optional<std::string> recompute_method;  // full only: uniform (default) or block
  std::optional<int64_t> recompute_num_layers;  // full only: default 1
  std::optional<std::string> schedule;          // default: interleaved when vpp > 1, else 1f1b
  ImplementationFlags implementation;
};

// The model the planning commands take when given neither --model nor model flags.
inline constexpr const char* kDefaultModel = "gpt3-175b";
// The name of a model defined by Megatron's model flags alone (no --model).
inline constexpr const char* kCustomModel = "custom";

// Whether any of Megatron's model flags is given (they then define the model without --model).
bool model_flags_given(const ModelOptions& options);

// Each throws SpecError naming the flag and the rule.
// --model's spec (or the custom model, or kDefaultModel) with the model flags over it. A custom
// model needs what Megatron-LM requires: --num-layers, --hidden-size, --num-attention-heads,
// --max-position-embeddings, and here --seq-length and the vocabulary (--vocab-size, or tokenizer
// flags through apply_pasted_vocabulary).
// Notes (core/notes.h) when the sequence length is a Hugging Face config's position table (over 8192).
ModelSpec resolve_model(const ModelOptions& options);
ClusterSpec resolve_cluster(const ClusterOptions& options);
// The implementation's defaults for `model` with the flags given applied (validated with the plan).
ImplementationOptions resolve_implementation_options(const ImplementationFlags& flags, Implementation implementation,
                                                     const ModelSpec& model);
// The plan flags for `world_size` GPUs: dp derived, vpp from either flag, the default schedule.
// Not yet validated against the model (validate_plan).
// `world_flag` names the flag that set the world size in errors (train's is --world-size).
ParallelPlan resolve_plan(const ModelSpec& model, int64_t world_size, const PlanOptions& options,
                          const std::string& world_flag = "--gpus");
// The whole job: model and GPUs resolved, dp derived, every rule validated.
// Notes (core/notes.h) the global batch it chose when --gbs is not given.
JobSpec resolve_job(const ModelOptions& model, const ClusterOptions& cluster, const PlanOptions& plan);

// The model flags given (ModelOptions' set fields and true flags) over `spec`, validated.
ModelSpec apply_model_flags(ModelSpec spec, const ModelOptions& options);

// Job flags given on a command line, by their longest name ("--tensor-model-parallel-size"), with
// their option group ("Parallel plan", "Implementation (Megatron-LM flags)", ...).
using GivenFlags = std::map<std::string, std::string>;

// The job from the flags, or from a job JSON file (`--plan`, as `describe --out` writes it) with
// the job flags in `given` (given_flags) overriding it: override_job.
JobSpec load_job(const ModelOptions& model, const ClusterOptions& cluster, const PlanOptions& plan,
                 const std::optional<std::string>& job_file, const GivenFlags& given = {});

// A job file with flags that override it, as Megatron-LM users combine a base script with extra
// arguments: the model's fields (not --model itself: SpecError), the cluster (--cluster, or --gpus
// of the job's cluster), each plan field given, dp derived again; implementation flags restate the
// options from the implementation's defaults. Validated.
JobSpec override_job(JobSpec job, const GivenFlags& given, const ModelOptions& model, const ClusterOptions& cluster,
                     const PlanOptions& plan);

}  // namespace megaplan
