// The job's options mapped onto core's specs.
#include "core/job_options.h"

#include <algorithm>
#include <functional>
#include <tuple>

#include "core/checked_math.h"
#include "core/hf_config.h"
#include "core/json_io.h"
#include "core/notes.h"
#include "core/schedule/schedule_traits.h"

namespace megaplan {

ImplementationOptions resolve_implementation_options(const ImplementationFlags& flags, Implementation implementation,
                                                     const ModelSpec& model) {
  ImplementationOptions options = default_implementation_options(implementation, model);
  // A model defined by Megatron's flags alone takes Megatron-LM's argparse defaults, its dropout
  // (0.1 hidden and attention) included, whichever implementation runs it.
  if (model.name == kCustomModel) options.attention_dropout = options.hidden_dropout = 0.1;
  if (flags.fp16) options.precision = DType::kFloat16;
  if (flags.bf16) options.precision = DType::kBFloat16;
  if (flags.transformer_impl)
    options.transformer_impl = parse_transformer_impl(*flags.transformer_impl, "--transformer-impl");
  if (flags.ddp_impl) options.ddp_impl = parse_ddp_impl(*flags.ddp_impl, "--DDP-impl");
  if (flags.use_flash_attn) options.use_flash_attn = true;
  if (flags.attention_dropout) options.attention_dropout = *flags.attention_dropout;
  if (flags.hidden_dropout) options.hidden_dropout = *flags.hidden_dropout;
  const std::pair<bool, bool ImplementationOptions::*> off[] = {
      {flags.no_masked_softmax_fusion, &ImplementationOptions::masked_softmax_fusion},
      {flags.no_bias_gelu_fusion, &ImplementationOptions::bias_gelu_fusion},
      {flags.no_bias_dropout_fusion, &ImplementationOptions::bias_dropout_fusion},
      {flags.no_gradient_accumulation_fusion, &ImplementationOptions::gradient_accumulation_fusion},
      {flags.no_scatter_gather_tensors_in_pipeline, &ImplementationOptions::scatter_gather_tensors_in_pipeline}};
  for (const auto& [given, member] : off) {
    if (given) options.*member = false;
  }
  const std::pair<bool, bool ImplementationOptions::*> on[] = {
      {flags.accumulate_allreduce_grads_in_fp32, &ImplementationOptions::accumulate_allreduce_grads_in_fp32},
      {flags.overlap_grad_reduce, &ImplementationOptions::overlap_grad_reduce},
      {flags.overlap_param_gather, &ImplementationOptions::overlap_param_gather},
      {flags.tp_comm_overlap, &ImplementationOptions::tp_comm_overlap}};
  for (const auto& [given, member] : on) {
    if (given) options.*member = true;
  }
  return options;
}

namespace {

// Megatron's integer model flags and the ModelSpec field each sets: one list for "was any given"
// and for applying them.
using IntegerFlag = std::tuple<std::optional<int64_t> ModelOptions::*, int64_t ModelSpec::*, const char*>;
constexpr IntegerFlag kIntegerModelFlags[] = {
    {&ModelOptions::num_layers, &ModelSpec::num_layers, "--num-layers"},
    {&ModelOptions::hidden_size, &ModelSpec::hidden_size, "--hidden-size"},
    {&ModelOptions::ffn_hidden_size, &ModelSpec::ffn_hidden_size, "--ffn-hidden-size"},
    {&ModelOptions::num_attention_heads, &ModelSpec::num_attention_heads, "--num-attention-heads"},
    {&ModelOptions::num_query_groups, &ModelSpec::num_query_groups, "--num-query-groups"},
    {&ModelOptions::kv_channels, &ModelSpec::kv_channels, "--kv-channels"},
    {&ModelOptions::seq_length, &ModelSpec::seq_length, "--seq-length"},
    {&ModelOptions::max_position_embeddings, &ModelSpec::max_position_embeddings, "--max-position-embeddings"},
    {&ModelOptions::vocab_size, &ModelSpec::vocab_size, "--vocab-size"},
    {&ModelOptions::make_vocab_size_divisible_by, &ModelSpec::make_vocab_size_divisible_by,
     "--make-vocab-size-divisible-by"}};

// The experts' flags and their fields of ModelSpec::moe; each given must be at least 1 (0 is no
// "unset": leave the flag out).
using MoeFlag = std::tuple<std::optional<int64_t> ModelOptions::*, int64_t MoeSpec::*, const char*>;
constexpr MoeFlag kMoeFlags[] = {
    {&ModelOptions::num_experts, &MoeSpec::num_experts, "--num-experts"},
    {&ModelOptions::moe_ffn_hidden_size, &MoeSpec::ffn_hidden_size, "--moe-ffn-hidden-size"},
    {&ModelOptions::moe_router_topk, &MoeSpec::router_topk, "--moe-router-topk"},
    {&ModelOptions::moe_shared_expert_intermediate_size, &MoeSpec::shared_expert_intermediate_size,
     "--moe-shared-expert-intermediate-size"}};

// The router's and the layer pattern's flags over `moe`; their rules are validate_moe_spec's (a
// factor given as 0 is refused there, not taken as unset).
void apply_router_flags(const ModelOptions& options, MoeSpec& moe) {
  if (options.moe_layer_freq) parse_moe_layer_freq(*options.moe_layer_freq, "--moe-layer-freq", moe);
  if (options.moe_router_score_function) {
    moe.score_function = parse_router_score_function(*options.moe_router_score_function, "--moe-router-score-function");
  }
  if (options.moe_router_load_balancing_type) {
    moe.load_balancing =
        parse_load_balancing(*options.moe_router_load_balancing_type, "--moe-router-load-balancing-type");
  }
  if (options.moe_token_drop_policy) {
    moe.token_drop_policy = parse_token_drop_policy(*options.moe_token_drop_policy, "--moe-token-drop-policy");
  }
  if (options.moe_token_dispatcher_type) {
    moe.token_dispatcher = parse_token_dispatcher(*options.moe_token_dispatcher_type, "--moe-token-dispatcher-type");
  }
  if (options.moe_router_topk_scaling_factor) moe.router_topk_scaling_factor = *options.moe_router_topk_scaling_factor;
  if (options.moe_router_bias_update_rate) moe.router_bias_update_rate = *options.moe_router_bias_update_rate;
  if (options.moe_expert_capacity_factor) moe.expert_capacity_factor = *options.moe_expert_capacity_factor;
  if (options.moe_aux_loss_coeff) moe.aux_loss_coeff = *options.moe_aux_loss_coeff;
  if (options.moe_z_loss_coeff) moe.z_loss_coeff = *options.moe_z_loss_coeff;
  moe.shared_expert_gate = moe.shared_expert_gate || options.moe_shared_expert_gate;
  moe.router_pre_softmax = moe.router_pre_softmax || options.moe_router_pre_softmax;
  moe.router_enable_expert_bias = moe.router_enable_expert_bias || options.moe_router_enable_expert_bias;
  moe.pad_expert_input_to_capacity = moe.pad_expert_input_to_capacity || options.moe_pad_expert_input_to_capacity;
}

}  // namespace

bool model_flags_given(const ModelOptions& options) {
  const std::optional<double>* reals[] = {&options.norm_epsilon,
                                          &options.rotary_base,
                                          &options.rotary_percent,
                                          &options.rope_scaling_factor,
                                          &options.moe_router_topk_scaling_factor,
                                          &options.moe_aux_loss_coeff,
                                          &options.moe_z_loss_coeff,
                                          &options.moe_router_bias_update_rate,
                                          &options.moe_expert_capacity_factor};
  const std::optional<std::string>* texts[] = {&options.normalization,
                                               &options.position_embedding_type,
                                               &options.moe_layer_freq,
                                               &options.moe_router_score_function,
                                               &options.moe_router_load_balancing_type,
                                               &options.moe_token_drop_policy,
                                               &options.moe_token_dispatcher_type};
  return std::any_of(std::begin(kIntegerModelFlags), std::end(kIntegerModelFlags),
                     [&](const IntegerFlag& flag) { return (options.*std::get<0>(flag)).has_value(); }) ||
         std::any_of(std::begin(kMoeFlags), std::end(kMoeFlags),
                     [&](const MoeFlag& flag) { return (options.*std::get<0>(flag)).has_value(); }) ||
         std::any_of(std::begin(reals), std::end(reals), [](const auto* flag) { return flag->has_value(); }) ||
         std::any_of(std::begin(texts), std::end(texts), [](const auto* flag) { return flag->has_value(); }) ||
         options.swiglu || options.group_query_attention || options.use_rope_scaling ||
         options.untie_embeddings_and_output_weights || options.disable_bias_linear || options.add_qkv_bias ||
         options.qk_layernorm || options.moe_shared_expert_gate || options.moe_router_pre_softmax ||
         options.moe_router_enable_expert_bias || options.moe_pad_expert_input_to_capacity;
}

namespace {

// Megatron-LM's model from its flags alone: ModelSpec's defaults are its argparse defaults, and
// its required arguments (validate_args) are required here too.
ModelSpec custom_model(const ModelOptions& options) {
  const std::pair<const std::optional<int64_t>&, const char*> required[] = {
      {options.num_layers, "--num-layers"},
      {options.hidden_size, "--hidden-size"},
      {options.num_attention_heads, "--num-attention-heads"},
      {options.max_position_embeddings, "--max-position-embeddings"},
      {options.seq_length, "--seq-length"}};
  for (const auto& [value, flag] : required) {
    if (!value) {
      throw SpecError(flag,
                      "required for a model defined by Megatron's flags (no --model given), as Megatron-LM "
                      "requires it");
    }
  }
  if (!options.vocab_size) {
    throw SpecError("--vocab-size",
                    "a model defined by Megatron's flags needs its vocabulary: --vocab-size, or the "
                    "tokenizer flags (--tokenizer-type GPT2BPETokenizer with --vocab-file and --merge-file)");
  }
  ModelSpec spec;
  spec.name = kCustomModel;
  return spec;
}

}  // namespace

ModelSpec resolve_model(const ModelOptions& options) {
  const bool custom = !options.model && model_flags_given(options);
  ModelSpec spec = apply_model_flags(
      custom ? custom_model(options) : load_model_spec(options.model.value_or(kDefaultModel)), options);
  // A Hugging Face config states its position table, not a training length: a Llama 3.1 config
  // would otherwise plan 131072-token sequences without a word.
  if (options.model && options.model->ends_with(".json") && !options.seq_length && spec.seq_length > 8192 &&
      spec.seq_length == spec.effective_max_position_embeddings()) {
    note("the sequence length " + std::to_string(spec.seq_length) + " is " + *options.model +
         "'s max_position_embeddings; pass --seq-length to train on shorter sequences");
  }
  return spec;
}

ModelSpec apply_model_flags(ModelSpec spec, const ModelOptions& options) {
  // Given, each is a count or a width: 0 is no "unset" (leave the flag out for the default).
  for (const auto& [flag, field, name] : kIntegerModelFlags) {
    if (!(options.*flag)) continue;
    if (*(options.*flag) < 1) {
      throw SpecError(name, "must be a positive integer, got " + std::to_string(*(options.*flag)) +
                                " (leave the flag out for the model's value)");
    }
    spec.*field = *(options.*flag);
  }
  for (const auto& [flag, field, name] : kMoeFlags) {
    if (!(options.*flag)) continue;
    if (*(options.*flag) < 1) {
      throw SpecError(name, "must be at least 1, got " + std::to_string(*(options.*flag)) +
                                (field == &MoeSpec::num_experts ? " (leave it out for a dense model)" : ""));
    }
    spec.moe.*field = *(options.*flag);
  }
  apply_router_flags(options, spec.moe);
  // Megatron's --num-query-groups defaults to 1 under --group-query-attention.
  if (options.group_query_attention && !options.num_query_groups) spec.num_query_groups = 1;
  if (options.normalization) spec.normalization = parse_normalization(*options.normalization, "--normalization");
  if (options.position_embedding_type) {
    spec.position_embedding_type =
        parse_position_embedding(*options.position_embedding_type, "--position-embedding-type");
  }
  if (options.norm_epsilon) spec.norm_epsilon = *options.norm_epsilon;
  if (options.rotary_base) spec.rotary_base = *options.rotary_base;
  if (options.rotary_percent) spec.rotary_percent = *options.rotary_percent;
  if (options.rope_scaling_factor && !options.use_rope_scaling && !spec.rope_scaling.enabled()) {
    throw SpecError("--rope-scaling-factor", "needs --use-rope-scaling");
  }
  if (options.use_rope_scaling && !spec.rope_scaling.enabled()) spec.rope_scaling = RopeScaling{.factor = 8};
  if (options.rope_scaling_factor) {
    require_rope_scaling_factor(*options.rope_scaling_factor, "--rope-scaling-factor");
    spec.rope_scaling.factor = *options.rope_scaling_factor;
  }
  spec.swiglu = spec.swiglu || options.swiglu;
  spec.untie_embeddings_and_output_weights =
      spec.untie_embeddings_and_output_weights || options.untie_embeddings_and_output_weights;
  spec.add_bias_linear = spec.add_bias_linear && !options.disable_bias_linear;
  spec.add_qkv_bias = spec.add_qkv_bias || options.add_qkv_bias;
  spec.qk_layernorm = spec.qk_layernorm || options.qk_layernorm;
  validate_model_spec(spec);
  return spec;
}

ClusterSpec resolve_cluster(const ClusterOptions& options) {
  const ClusterSpec cluster = load_cluster_spec(options.cluster);
  if (!options.gpus && cluster.num_nodes > 1) {
    throw SpecError("--gpus", "required for the multi-node cluster " + cluster.name + " (" +
                                  std::to_string(cluster.num_nodes) + " nodes x " +
                                  std::to_string(cluster.gpus_per_node) + " GPUs)");
  }
  return select_gpus(cluster, options.gpus.value_or(cluster.total_gpus()));
}

namespace {

// The plan flags over `plan`: each field whose flag `take` names (by its longest spelling) takes
// the flag's value, then the rules that tie flags together, the same for a plan from flags alone
// (`take` every field, defaults included) and for flags over a job file (`take` those given).
ParallelPlan apply_plan_flags(ParallelPlan plan, const ModelSpec& model, int64_t world_size, const PlanOptions& options,
                              const std::function<bool(const char*)>& take, bool implementation_given,
                              const std::string& world_flag) {
  if (take("--tensor-model-parallel-size")) plan.tensor_parallel_size = options.tensor_parallel_size;
  if (take("--pipeline-model-parallel-size")) plan.pipeline_parallel_size = options.pipeline_parallel_size;
  if (take("--context-parallel-size")) plan.context_parallel_size = options.context_parallel_size;
  if (take("--expert-model-parallel-size")) plan.expert_model_parallel_size = options.expert_model_parallel_size;
  if (take("--moe-imbalance")) plan.moe_imbalance = options.moe_imbalance;
  plan.data_parallel_size = derive_data_parallel_size(
      world_size, plan.tensor_parallel_size, plan.pipeline_parallel_size, plan.context_parallel_size, world_flag);
  if (take("--virtual-pipeline-model-parallel-size")) {
    plan.virtual_pipeline_parallel_size = options.virtual_pipeline_parallel_size.value_or(1);
  }
  if (options.layers_per_virtual_stage) {
    const int64_t vpp = virtual_pipeline_size_from_layers_per_stage(model.num_layers, plan.pipeline_parallel_size,
                                                                    *options.layers_per_virtual_stage);
    if (options.virtual_pipeline_parallel_size && *options.virtual_pipeline_parallel_size != vpp) {
      throw SpecError("--num-layers-per-virtual-pipeline-stage",
                      "gives vpp " + std::to_string(vpp) +
                          ", which contradicts --virtual-pipeline-model-parallel-size " +
                          std::to_string(*options.virtual_pipeline_parallel_size));
    }
    plan.virtual_pipeline_parallel_size = vpp;
  }
  if (take("--decoder-first-pipeline-num-layers")) {
    plan.pipeline_split.first_stage_layers = options.pipeline_split.first_stage_layers;
  }
  if (take("--decoder-last-pipeline-num-layers")) {
    plan.pipeline_split.last_stage_layers = options.pipeline_split.last_stage_layers;
  }
  if (take("--account-for-embedding-in-pipeline-split")) {
    plan.pipeline_split.account_for_embedding = options.pipeline_split.account_for_embedding;
  }
  if (take("--account-for-loss-in-pipeline-split"))
    plan.pipeline_split.account_for_loss = options.pipeline_split.account_for_loss;
  if (!plan.pipeline_split.even() && options.layers_per_virtual_stage) {
    throw SpecError("--num-layers-per-virtual-pipeline-stage",
                    "assumes even stages; with an uneven split give --virtual-pipeline-model-parallel-size");
  }
  if (take("--micro-batch-size")) plan.micro_batch_size = options.micro_batch_size;
  if (take("--global-batch-size")) {
    plan.global_batch_size = options.global_batch_size.value_or(
        checked_multiply(options.micro_batch_size, plan.data_parallel_size, "--micro-batch-size"));
  }
  if (take("--sequence-parallel")) plan.sequence_parallel = options.sequence_parallel;
  if (const std::optional<int64_t>& etp = options.expert_tensor_parallel_size) {
    if (!model.moe.enabled()) throw SpecError("--expert-tensor-parallel-size", "needs --num-experts");
    require_positive(*etp, "--expert-tensor-parallel-size");
    plan.expert_tensor_parallel_size = *etp;
  }
  if (take("--use-distributed-optimizer")) plan.use_distributed_optimizer = options.use_distributed_optimizer;
  if (take("--recompute-granularity")) {
    plan.recompute_granularity = parse_recompute_granularity(options.recompute_granularity, "--recompute-granularity");
  }
  if (options.recompute_activations) plan.recompute_granularity = RecomputeGranularity::kSelective;  // Megatron's alias
  if (plan.recompute_granularity != RecomputeGranularity::kFull) {
    // As Megatron: the method and the layer count describe full recomputation only.
    if (options.recompute_method) throw SpecError("--recompute-method", "needs --recompute-granularity full");
    if (options.recompute_num_layers) throw SpecError("--recompute-num-layers", "needs --recompute-granularity full");
  }
  if (options.recompute_method)
    plan.recompute_method = parse_recompute_method(*options.recompute_method, "--recompute-method");
  if (take("--recompute-num-layers")) plan.recompute_num_layers = options.recompute_num_layers.value_or(1);
  if (implementation_given) {
    // Implementation flags restate the options from the implementation's defaults.
    if (take("--implementation")) {
      plan.implementation = parse_implementation(options.implementation.implementation, "--implementation");
    }
    plan.options = resolve_implementation_options(options.implementation, plan.implementation, model);
  }
  // Megatron's own checks on the two flags when given (an implementation's defaults apply them
  // where they can take effect).
  if (options.implementation.overlap_param_gather && !plan.use_distributed_optimizer) {
    throw SpecError("--overlap-param-gather",
                    "needs --use-distributed-optimizer (it overlaps the all-gather of "
                    "the updated parameter shards)");
  }
  if (options.implementation.tp_comm_overlap && !plan.sequence_parallel) {
    throw SpecError("--tp-comm-overlap", "needs --sequence-parallel (it overlaps its all-gathers and reduce-scatters)");
  }
  if (take("--schedule")) {
    plan.schedule = options.schedule                          ? parse_schedule_kind(*options.schedule, "--schedule")
                    : plan.virtual_pipeline_parallel_size > 1 ? ScheduleKind::kInterleaved
                                                              : ScheduleKind::kOneFOneB;
    if (!options.virtual_pipeline_parallel_size && !options.layers_per_virtual_stage) {
      plan.virtual_pipeline_parallel_size = default_virtual_pipeline_size(plan.schedule);
    }
  }
  return plan;
}

}  // namespace

ParallelPlan resolve_plan(const ModelSpec& model, int64_t world_size, const PlanOptions& options,
                          const std::string& world_flag) {
  return apply_plan_flags(
      ParallelPlan{}, model, world_size, options, [](const char*) { return true; }, true, world_flag);
}

JobSpec resolve_job(const ModelOptions& model_options, const ClusterOptions& cluster_options,
                    const PlanOptions& options) {
  JobSpec job{resolve_model(model_options), resolve_cluster(cluster_options), ParallelPlan{}};
  job.plan = resolve_plan(job.model, job.cluster.total_gpus(), options);
  validate_job(job);
  if (!options.global_batch_size) {
    note("--gbs not given: the global batch is " + std::to_string(job.plan.global_batch_size) + " (mbs " +
         std::to_string(job.plan.micro_batch_size) + " x dp " + std::to_string(job.plan.data_parallel_size) +
         ", one microbatch per replica; `search` assumes 1536)");
  }
  return job;
}

JobSpec load_job(const ModelOptions& model, const ClusterOptions& cluster, const PlanOptions& plan,
                 const std::optional<std::string>& job_file, const GivenFlags& given) {
  if (!job_file) return resolve_job(model, cluster, plan);
  JobSpec job = job_spec_from_json(read_json_file(*job_file), *job_file);
  validate_job(job);
  if (!given.empty()) job = override_job(std::move(job), given, model, cluster, plan);
  return job;
}

JobSpec override_job(JobSpec job, const GivenFlags& given, const ModelOptions& model, const ClusterOptions& cluster,
                     const PlanOptions& options) {
  const auto has = [&](const char* flag) { return given.count(flag) > 0; };
  if (has("--model")) {
    throw SpecError("--model",
                    "cannot be combined with --plan: the job file holds the model (its fields take the "
                    "model flags)");
  }
  job.model = apply_model_flags(job.model, model);
  if (has("--cluster") || has("--gpus")) {
    ClusterOptions chosen = cluster;
    if (!has("--cluster")) chosen.cluster = job.cluster.name;  // --gpus alone: more or fewer of the job's GPUs
    job.cluster = resolve_cluster(chosen);
  }
  // Implementation flags restate the options from the implementation's defaults.
  const bool implementation_given = std::any_of(
      given.begin(), given.end(), [](const auto& flag) { return flag.second.rfind("Implementation", 0) == 0; });
  job.plan = apply_plan_flags(std::move(job.plan), job.model, job.cluster.total_gpus(), options, has,
                              implementation_given, "--gpus");
  validate_job(job);
  return job;
}

}  // namespace megaplan
