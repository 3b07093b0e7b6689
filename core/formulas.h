// Closed-form counts: parameters (per layer, per pipeline rank, per GPU under tensor parallelism)
// and FLOPs per iteration (Megatron's model FLOPs, and hardware FLOPs with recomputation).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/model_spec.h"
#include "core/parallel_plan.h"

namespace megaplan {

// Parameters of one transformer layer, split as tensor parallelism splits them: `sharded` is
// divided over the tp ranks (QKV, projection, MLP weights; column-parallel biases), `replicated`
// sits whole on every tp rank (norms, row-parallel biases).
struct LayerParameters {
  int64_t attention = 0;  // QKV and output projection, weights and biases
  int64_t mlp = 0;        // fc1 (two halves with SwiGLU) and fc2, weights and biases; with experts,
                          // the router, every expert and the shared expert
  int64_t norms = 0;      // the two pre-norms (and --qk-layernorm's query and key norms)
  int64_t sharded = 0;
  int64_t replicated = 0;
  // The experts' share of sharded and replicated, which expert parallelism also splits (each ep rank
  // holds num_experts / ep of them).
  int64_t expert_sharded = 0;
  int64_t expert_replicated = 0;
  int64_t total() const { return attention + mlp + norms; }
  // The routed experts' sharded parameters cut over `expert_tensor_parallel_size` (0: tp).
  // REQUIRES: tp divides the sharded dimensions, etp the experts', ep the experts (validate_plan).
  int64_t per_gpu(int64_t tensor_parallel_size, int64_t expert_parallel_size = 1,
                  int64_t expert_tensor_parallel_size = 0) const {
    const int64_t etp = expert_tensor_parallel_size > 0 ? expert_tensor_parallel_size : tensor_parallel_size;
    return (sharded - expert_sharded) / tensor_parallel_size + expert_sharded / (etp * expert_parallel_size) +
           (replicated - expert_replicated) + expert_replicated / expert_parallel_size;
  }
};

// A layer with the dense MLP, or with `experts` (where the model has them) Megatron's MoE layer.
LayerParameters transformer_layer_parameters(const ModelSpec& model, bool experts = false);

// Distinct trainable parameters of the whole model (tied embeddings counted once), with the
// vocabulary padded for `tensor_parallel_size` as Megatron pads it.
// REQUIRES: validate_model_spec(model) passed.
int64_t total_parameters(const ModelSpec& model, int64_t tensor_parallel_size = 1);
// The parameters one token passes through: total_parameters less, with experts, every layer's
// experts outside its top k.
int64_t active_parameters(const ModelSpec& model, int64_t tensor_parallel_size = 1);

// Parameters held by one pipeline rank. With tied embeddings and more than one rank, the last
// stage keeps its own copy of the word embeddings for the output layer (Megatron's embedding
// group keeps the two in sync), so the sum over ranks can exceed total_parameters().
struct PipelineRankParameters {
  int64_t pipeline_rank = 0;
  int64_t num_layers = 0;
  bool has_embedding = false;      // word (and learned position) embeddings
  bool has_output_layer = false;   // final norm and output projection (or the tied copy)
  int64_t parameters = 0;          // whole, before tensor parallelism
  int64_t parameters_per_gpu = 0;  // on each of the rank's tp GPUs
  int64_t expert_per_gpu = 0;      // of those, the routed experts' (reduced and sharded over expert dp)
};

// REQUIRES: validate_plan(model, plan) passed.
std::vector<PipelineRankParameters> parameters_per_pipeline_rank(const ModelSpec& model, const ParallelPlan& plan);

// parameters_per_pipeline_rank's parameters_per_gpu (and expert_per_gpu) for one model, computed
// once per layout that decides them (tp, pp, vpp, the stage placement, the pipeline split and ep),
// not once per plan: a search asks ~10^5 plans. Safe to share between threads.
class ParametersPerGpuCache {
 public:
  explicit ParametersPerGpuCache(const ModelSpec& model) : model_(model) {}
  // By pipeline rank. The references stay valid as long as the cache.
  const std::vector<int64_t>& per_pipeline_rank(const ParallelPlan& plan) const { return entry(plan).parameters; }
  const std::vector<int64_t>& experts_per_pipeline_rank(const ParallelPlan& plan) const { return entry(plan).experts; }

 private:
  using Key = std::tuple<int64_t, int64_t, int64_t, StagePlacement, int64_t, int64_t, bool, bool, int64_t, int64_t>;
  struct Entry {
    std::vector<int64_t> parameters, experts;
  };
  const Entry& entry(const ParallelPlan& plan) const;
  const ModelSpec& model_;
  mutable std::mutex mutex_;
  mutable std::map<Key, Entry> by_layout_;
};

// Parameters one virtual stage holds, whole and on each of its tp GPUs; the rank's are the sum
// over its stages. `holds_output_weight`: the last stage has an output weight of its own (untied,
// or the tied copy when stage 0 sits on another pipeline rank).
struct StageParameters {
  int64_t parameters = 0;
  int64_t parameters_per_gpu = 0;
  // The word embedding's share of parameters_per_gpu on the stage that holds it (its gradient is
  // whole only when the backward has run through the embedding, the stage's last work).
  int64_t word_embedding_per_gpu = 0;
  // The routed experts' share of parameters_per_gpu (their gradients are summed over expert dp).
  int64_t expert_per_gpu = 0;
  bool holds_output_weight = false;
};

// REQUIRES: validate_plan(model, plan) passed; 0 <= stage < plan.num_virtual_stages().
StageParameters stage_parameters(const ModelSpec& model, const ParallelPlan& plan, int64_t stage);

// Tokens of one microbatch on one GPU of a context-parallel group, before tensor parallelism:
// micro batch size x seq / cp (the rows of the layer's GEMMs).
inline int64_t tokens_per_microbatch(const ModelSpec& model, const ParallelPlan& plan) {
  return model.seq_length / plan.context_parallel_size * plan.micro_batch_size;
}

// Megatron's num_floating_point_operations: forward and backward FLOPs of `batch_size`
// sequences, counting each GEMM as 2mnk, attention scores over the full s x s square, and
// backward as twice forward. For GPT it reduces to 72 B s l h^2 (1 + s/6h + V/12lh); it is
// generalised for GQA (query groups), kv_channels != h/heads and SwiGLU (3/2 the MLP FLOPs).
double model_flops(const ModelSpec& model, int64_t batch_size, int64_t padded_vocab_size);

// model_flops plus the forward work recomputation repeats: selective recomputes the attention
// core (QK^T and AV), full recomputes every transformer layer's forward (not the output layer).
double hardware_flops(const ModelSpec& model, int64_t batch_size, int64_t padded_vocab_size,
                      RecomputeGranularity recompute);

}  // namespace megaplan
