// Memory per pipeline rank: static state by bytes per parameter, activations by the schedule.
#include "core/memory_model.h"

#include <algorithm>
#include <cmath>

#include "core/checked_math.h"
#include "core/executor_memory.h"
#include "core/formulas.h"
#include "core/kernel_list.h"
#include "core/pipeline_layout.h"

namespace megaplan {

namespace {

constexpr int64_t kActivationBytes = 2;  // bf16
constexpr int64_t kSoftmaxBytes = 4;     // fp32 cross-entropy softmax

}  // namespace

StageActivationBytes transformer_layer_activation_bytes(const ModelSpec& model, const ParallelPlan& plan) {
  const int64_t sb = tokens_per_microbatch(model, plan);
  const int64_t t = plan.tensor_parallel_size;
  const int64_t h = model.hidden_size;
  const int64_t f = model.effective_ffn_hidden_size();
  const int64_t q = model.query_projection_size();
  const int64_t kv = model.kv_projection_size();
  // Outside the tensor-parallel region (the two norms' inputs and outputs, which are the QKV and
  // fc1 GEMMs' inputs) every tp rank holds the whole tensor unless sequence parallelism splits it.
  const int64_t outside = plan.sequence_parallel ? t : 1;
  const int64_t norm_inputs = 2 * kActivationBytes * sb * h / outside;
  const int64_t gemm_inputs_outside = 2 * kActivationBytes * sb * h / outside;  // QKV and fc1 inputs
  // Inside it, split over tp: Q, K, V; the attention core's output (also the projection's input);
  // fc1's output (twice as wide with SwiGLU); fc2's input.
  const int64_t heads = model.num_attention_heads;
  const int64_t attention_output = kActivationBytes * sb * q / t;
  const int64_t fc1_output = kActivationBytes * sb * f * (model.swiglu ? 2 : 1) / t;
  const int64_t fc2_input = kActivationBytes * sb * f / t;
  // Fused (flash) attention keeps Q, K, V and an fp32 log-sum-exp per head and token. Unfused
  // attention keeps Q with K and V repeated to every head (its batched GEMMs' inputs), and
  // Korthikanti's 5as^2b: the softmax output and, with attention dropout, its mask and output;
  // selective recomputation reruns the core and keeps none of the s x s terms.
  const ImplementationOptions& options = plan.options;
  const bool fused = fused_attention(options);
  const int64_t qkv = kActivationBytes * sb * (fused ? q + 2 * kv : 3 * q) / t;
  int64_t attention_core = fused ? 4 * sb * heads / t : 0;
  if (!fused && plan.recompute_granularity != RecomputeGranularity::kSelective) {
    const int64_t scores = sb * heads * model.seq_length / plan.context_parallel_size / t;  // b a s^2 / t
    attention_core = scores * (kActivationBytes + (options.attention_dropout > 0 ? 1 + kActivationBytes : 0));
  }
  // --qk-layernorm: the query and key norms keep their inputs and an fp32 rstd per head and token.
  const int64_t qk_norms = model.qk_layernorm ? kActivationBytes * sb * (q + kv) / t +
                                                    4 * sb * (heads + model.effective_num_query_groups()) / t
                                              : 0;
  // Hidden dropout keeps a one-byte mask after each branch (outside the tp region).
  const int64_t dropout_masks = options.hidden_dropout > 0 ? 2 * sb * h / outside : 0;

  StageActivationBytes bytes;
  if (plan.recompute_granularity == RecomputeGranularity::kFull) {
    bytes.activation = kActivationBytes * sb * h / outside;  // the layer's input only
  } else {
    bytes.activation = norm_inputs + gemm_inputs_outside + qkv + attention_core + attention_output + fc1_output +
                       fc2_input + dropout_masks + qk_norms;
  }
  // W needs the four weight GEMMs' inputs: QKV and fc1 (outside), projection and fc2 (inside).
  bytes.weight_gradient_input = gemm_inputs_outside + kActivationBytes * sb * q / t + fc2_input;
  if (plan.recompute_granularity == RecomputeGranularity::kFull) {
    bytes.weight_gradient_input = std::min(bytes.weight_gradient_input, bytes.activation);
  }
  return bytes;
}

std::vector<StageActivationBytes> stage_activation_bytes(const ModelSpec& model, const ParallelPlan& plan) {
  // A checkpointed group keeps its first layer's input (what transformer_layer_activation_bytes
  // gives under full recomputation); the layers --recompute-method leaves alone keep everything.
  const bool full = plan.recompute_granularity == RecomputeGranularity::kFull;
  const StageActivationBytes per_layer = transformer_layer_activation_bytes(model, plan);
  ParallelPlan no_recompute = plan;
  no_recompute.recompute_granularity = RecomputeGranularity::kNone;
  const StageActivationBytes whole = full ? transformer_layer_activation_bytes(model, no_recompute) : per_layer;
  std::vector<StageActivationBytes> stages;
  for (const int64_t layers : stage_layer_counts(model, plan)) {
    StageActivationBytes stage;
    for (const LayerGroup& group : recompute_groups(plan, layers)) {
      const bool checkpointed = full && group.recomputed;
      const int64_t count = checkpointed ? 1 : group.num_layers;
      stage.activation += count * (checkpointed ? per_layer : whole).activation;
      stage.weight_gradient_input += count * (checkpointed ? per_layer : whole).weight_gradient_input;
    }
    stages.push_back(stage);
  }
  // The last stage: the final norm's input and the cross entropy's fp32 softmax over the
  // vocabulary-parallel logits, kept until the backward.
  const int64_t sb = tokens_per_microbatch(model, plan);
  const int64_t t = plan.tensor_parallel_size;
  const int64_t outside = plan.sequence_parallel ? t : 1;
  const int64_t vocabulary = padded_vocab_size(model, t);
  stages.back().activation += kActivationBytes * sb * model.hidden_size / outside + kSoftmaxBytes * sb * vocabulary / t;
  // The embedding dropout's mask on the first stage.
  if (plan.options.hidden_dropout > 0) stages.front().activation += sb * model.hidden_size / outside;
  return stages;
}

ModelStateBytes model_state_bytes(const ParallelPlan& plan, int64_t parameters_per_gpu) {
  const int64_t optimizer_shards = plan.use_distributed_optimizer ? plan.gradient_group_size() : 1;
  ModelStateBytes bytes;
  bytes.weight_bytes = checked_multiply(parameters_per_gpu, 2, "weight bytes");
  bytes.gradient_bytes = checked_multiply(parameters_per_gpu, main_gradient_bytes(plan.options), "gradient bytes");
  bytes.optimizer_bytes = checked_multiply(parameters_per_gpu, 12, "optimizer bytes") / optimizer_shards;
  return bytes;
}

int64_t peak_model_state_bytes(const ModelSpec& model, const ParallelPlan& plan) {
  int64_t peak = 0;
  for (const PipelineRankParameters& rank : parameters_per_pipeline_rank(model, plan)) {
    peak = std::max(peak, model_state_bytes(plan, rank.parameters_per_gpu).total());
  }
  return peak;
}

namespace {

std::vector<PipelineRankMemory> megatron_memory(const ModelSpec& model, const ParallelPlan& plan,
                                                const PipelineSchedule& schedule) {
  const std::vector<StageActivationBytes> per_stage = stage_activation_bytes(model, plan);
  const std::vector<RankScheduleFacts> facts = schedule_facts(schedule, per_stage);
  const std::vector<PipelineRankParameters> parameters = parameters_per_pipeline_rank(model, plan);
  const int64_t sb = tokens_per_microbatch(model, plan);
  const int64_t t = plan.tensor_parallel_size;
  const StageActivationBytes layer = transformer_layer_activation_bytes(model, plan);
  const ParallelPlan no_recompute = [&] {
    ParallelPlan copy = plan;
    copy.recompute_granularity = RecomputeGranularity::kNone;
    return copy;
  }();
  const int64_t rematerialised_layer = transformer_layer_activation_bytes(model, no_recompute).activation;
  const std::vector<int64_t> layer_counts = stage_layer_counts(model, plan);

  std::vector<PipelineRankMemory> ranks;
  for (const PipelineRankParameters& rank_parameters : parameters) {
    const auto rank = static_cast<std::size_t>(rank_parameters.pipeline_rank);
    PipelineRankMemory memory;
    memory.pipeline_rank = rank_parameters.pipeline_rank;
    memory.parameters_per_gpu = rank_parameters.parameters_per_gpu;
    const ModelStateBytes state = model_state_bytes(plan, rank_parameters.parameters_per_gpu);
    memory.weight_bytes = state.weight_bytes;
    memory.gradient_bytes = state.gradient_bytes;
    memory.optimizer_bytes = state.optimizer_bytes;
    memory.peak_inflight_microbatches = facts[rank].peak_inflight_microbatches;
    memory.activation_bytes = facts[rank].peak_held_bytes;
    int64_t transient = 0;
    if (rank_parameters.has_output_layer) {
      transient = kActivationBytes * sb * padded_vocab_size(model, t) / t;  // the bf16 logits
    }
    if (plan.recompute_granularity == RecomputeGranularity::kFull) {
      // The largest checkpointed group, run forward again whole in the backward.
      int64_t group_layers = 0;
      for (const int64_t stage : stages_of_pipeline_rank(rank_parameters.pipeline_rank, plan)) {
        for (const LayerGroup& group : recompute_groups(plan, layer_counts[static_cast<std::size_t>(stage)])) {
          if (group.recomputed) group_layers = std::max(group_layers, group.num_layers);
        }
      }
      transient = std::max(transient, group_layers * rematerialised_layer - layer.activation);
    }
    memory.transient_bytes = transient;
    memory.allocator_overhead_bytes = static_cast<int64_t>(
        std::ceil(kAllocatorOverheadFraction * static_cast<double>(memory.activation_bytes + transient)));
    memory.runtime_reserve_bytes = state.runtime_reserve_bytes;
    memory.total_bytes = memory.weight_bytes + memory.gradient_bytes + memory.optimizer_bytes +
                         memory.activation_bytes + memory.transient_bytes + memory.allocator_overhead_bytes +
                         memory.runtime_reserve_bytes;
    ranks.push_back(memory);
  }
  return ranks;
}

}  // namespace

std::vector<PipelineRankMemory> executor_pipeline_memory(const ModelSpec& model, const ParallelPlan& plan,
                                                         const ExecutorMemoryWalk& walk) {
  // bf16 compute and flash attention; the CUDA context and libraries' workspaces as the reserve;
  // the executor's own allocator has no fragmentation to allow for.
  std::vector<PipelineRankMemory> ranks;
  const std::vector<PipelineRankParameters> parameters = parameters_per_pipeline_rank(model, plan);
  for (const ExecutorRankMemory& rank : price_executor_memory(walk, model, plan, ExecutorPrecision{})) {
    PipelineRankMemory memory;
    memory.pipeline_rank = rank.pipeline_rank;
    memory.parameters_per_gpu = parameters[static_cast<std::size_t>(rank.pipeline_rank)].parameters_per_gpu;
    memory.weight_bytes = rank.compute_weight_bytes;
    memory.gradient_bytes = rank.gradient_bytes;
    memory.optimizer_bytes = rank.master_weight_bytes + rank.optimizer_bytes;  // as Megatron counts its fp32 copy
    memory.peak_inflight_microbatches = rank.peak_inflight_microbatches;
    memory.activation_bytes = rank.activation_bytes;
    memory.transient_bytes = rank.scratch_bytes;
    memory.runtime_reserve_bytes = kRuntimeReserveBytes;
    memory.total_bytes = rank.total_bytes + memory.runtime_reserve_bytes;
    ranks.push_back(memory);
  }
  return ranks;
}

std::vector<PipelineRankMemory> memory_per_pipeline_rank(const ModelSpec& model, const ParallelPlan& plan,
                                                         const PipelineSchedule& schedule) {
  require_costed_layers(model, plan);  // Megatron's activations are a dense layer's
  return plan.implementation == Implementation::kMegaplan
             ? executor_pipeline_memory(model, plan, walk_executor_memory(model, plan, schedule))
             : megatron_memory(model, plan, schedule);
}

}  // namespace megaplan
