// The parameters of megaplan's GPT, per virtual pipeline stage and tensor-parallel rank, in the
// order the executor registers them, with Megatron's names and splits; and the DDP buffer they
// fill (parameter_layout.h). One home for the executor, which allocates them, its checkpoints,
// which name them, and the memory prediction (executor_memory.h), which counts them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/model_spec.h"
#include "core/parallel_plan.h"
#include "core/parameter_layout.h"

namespace megaplan {

// Megatron's splits: column-parallel (QKV, fc1: output rows), row-parallel (projection, fc2:
// input columns), vocabulary-parallel (embedding rows), or whole on every rank (norms, row biases).
enum class TensorSplit { kReplicated, kColumn, kRow, kVocabulary };

// What a parameter is, before any memory exists.
struct ParameterSpec {
  std::string name;                   // Megatron's, e.g. "decoder.layers.0.self_attention.linear_qkv.weight"
  std::vector<int64_t> shape;         // this rank's shard
  std::vector<int64_t> global_shape;  // the whole tensor, as the single-rank model holds it
  // Tensor parallelism cuts a column-parallel or vocabulary-parallel tensor along dimension 0 and a
  // row-parallel one along dimension 1 into `shard_count` equal parts; this rank holds part
  // `shard_index`. Replicated tensors: part 0 of 1 on every rank.
  int64_t shard_index = 0;
  int64_t shard_count = 1;
  TensorSplit split = TensorSplit::kReplicated;
  // A column-parallel tensor of `chunks` blocks stacked along dimension 0, each cut alike, so that
  // a rank holds its part of every block: SwiGLU's fc1 [gate; up] (a rank's [gate_r; up_r]).
  int64_t chunks = 1;
  bool weight_decay = true;  // off for biases and norms
  // A routed expert's: its gradient sums over the expert data-parallel group, in buckets of its own.
  bool expert = false;
  std::size_t size = 0;
};

// Megatron's names of the tied pair: the word embedding, and the last stage's copy of it when stage 0
// sits on another pipeline rank (checkpoints read one for the other).
inline constexpr const char* kWordEmbeddings = "embedding.word_embeddings.weight";
inline constexpr const char* kOutputWeight = "output_layer.weight";

// The parameters of `stage` on tensor-parallel rank `tp_rank`, expert-parallel rank `ep_rank` and
// expert tensor-parallel rank `etp_rank` (-1: tp_rank where the experts are cut over tp, 0 at etp
// 1; needed otherwise), in registration order. The sum of their sizes is stage_parameters(model, plan,
// stage).parameters_per_gpu (formulas.h). In a layer with experts (Megatron-Core's names): the
// router "mlp.router.weight" [experts x h] whole; the ep rank's experts, each an MLP named
// "mlp.experts.local_experts.<e>.linear_fc1.weight" ... by its index e among the layer's (experts
// e of ep rank r: r x experts / ep onwards), split over etp as the dense MLP over tp; the shared expert
// "mlp.shared_experts.linear_fc1.weight" ... and its gate "mlp.shared_experts.gate_weight" [1 x h].
// REQUIRES: validate_plan(model, plan) passed; 0 <= ep_rank < ep.
std::vector<ParameterSpec> describe_parameters(const ModelSpec& model, const ParallelPlan& plan, int64_t stage,
                                               int64_t tp_rank = 0, int64_t ep_rank = 0, int64_t etp_rank = -1);

// Megatron DDP's buffer for the parameters of `stage` (the same on every tensor-parallel rank):
// the word embedding (or its tied copy) in a bucket of its own; buckets of `bucket_size` elements
// (0: Megatron's default); the routed experts' parameters in buckets of their own, padded to the
// expert data-parallel size (Megatron keeps them in a buffer of their own). REQUIRES:
// validate_plan(model, plan) passed.
ParameterLayout stage_layout(const ModelSpec& model, const ParallelPlan& plan, int64_t stage, std::size_t bucket_size);

}  // namespace megaplan
