// The executor's parameters, from core's model and plan (see parameter_list.h).
#include "core/parameter_list.h"

#include <stdexcept>
#include <string_view>
#include <utility>

#include "core/error.h"
#include "core/formulas.h"
#include "core/pipeline_layout.h"

namespace megaplan {

namespace {

// One parameter as the enumeration gives it: a name within its layer (or the model), the whole
// shape (`columns` 0 for a vector) and how tensor parallelism splits it.
struct Entry {
  int64_t layer;     // -1 outside the transformer layers
  const char* name;  // after "decoder.layers.<layer>." inside them (and an expert's prefix)
  int64_t rows, columns;
  TensorSplit split;
  bool decay;
  int64_t chunks = 1;   // ParameterSpec::chunks
  int64_t expert = -1;  // a routed expert's index among the layer's (global, not the ep rank's)
};

// Megatron-Core's names inside an MoE layer: its router, each routed expert (SequentialMLP's
// local_experts, numbered over the whole layer) and the shared expert with its gate.
constexpr const char* kExpertPrefix = "mlp.experts.local_experts.";

// Calls visit(entry) for each parameter of `stage`, in registration order. One home for what the
// list holds: describe_parameters names them, stage_layout only counts them (the planner asks for
// ~10^5 plans' layouts and needs no names).
template <typename Visit>
void for_each_parameter(const ModelSpec& model, const ParallelPlan& plan, int64_t stage, int64_t ep_rank, Visit visit) {
  const StageLayers layers = stage_layers(stage, model, plan);
  const int64_t h = model.hidden_size, f = model.effective_ffn_hidden_size();
  const int64_t v = padded_vocab_size(model, plan.tensor_parallel_size);
  // Biases follow --disable-bias-linear (Qwen2's --add-qkv-bias keeps QKV's); RMSNorm has no bias.
  const bool bias = model.add_bias_linear;
  const bool norm_bias = model.normalization == Normalization::kLayerNorm;
  const int64_t q = model.query_projection_size();
  const int64_t qkv = q + 2 * model.kv_projection_size();
  constexpr TensorSplit kWhole = TensorSplit::kReplicated;
  const auto norm = [&](int64_t layer, const char* weight, const char* bias_name) {
    visit(Entry{layer, weight, h, 0, kWhole, false});
    if (norm_bias) visit(Entry{layer, bias_name, h, 0, kWhole, false});
  };
  // An MLP of `width`: fc1 column-parallel ([gate; up] with SwiGLU), fc2 row-parallel, their biases
  // where the model has them; the dense one, an expert, or the shared expert.
  const auto mlp = [&](int64_t layer, const char* fc1_weight, const char* fc1_bias, const char* fc2_weight,
                       const char* fc2_bias, int64_t width, int64_t expert) {
    const int64_t chunks = model.swiglu ? 2 : 1;
    visit(Entry{layer, fc1_weight, chunks * width, h, TensorSplit::kColumn, true, chunks, expert});
    if (bias) visit(Entry{layer, fc1_bias, chunks * width, 0, TensorSplit::kColumn, false, chunks, expert});
    visit(Entry{layer, fc2_weight, h, width, TensorSplit::kRow, true, 1, expert});
    if (bias) visit(Entry{layer, fc2_bias, h, 0, kWhole, false, 1, expert});
  };
  if (layers.has_embedding) {
    visit(Entry{-1, kWordEmbeddings, v, h, TensorSplit::kVocabulary, true});
    if (model.position_embedding_type == PositionEmbedding::kLearnedAbsolute) {
      visit(Entry{-1, "embedding.position_embeddings.weight", model.effective_max_position_embeddings(), h, kWhole,
                  true});
    }
  }
  for (int64_t l = layers.first_layer; l < layers.first_layer + layers.num_layers; ++l) {
    norm(l, "input_layernorm.weight", "input_layernorm.bias");
    // Rows grouped by query group, each group's queries, key and value together (Megatron's
    // layout): a column cut holds whole groups.
    visit(Entry{l, "self_attention.linear_qkv.weight", qkv, h, TensorSplit::kColumn, true});
    if (bias || model.add_qkv_bias)
      visit(Entry{l, "self_attention.linear_qkv.bias", qkv, 0, TensorSplit::kColumn, false});
    // --qk-layernorm: one norm over head_dim for every query head, one for every key head, whole
    // on each tp rank (each rank normalises its own heads).
    if (model.qk_layernorm) {
      visit(Entry{l, "self_attention.q_layernorm.weight", model.effective_kv_channels(), 0, kWhole, false});
      visit(Entry{l, "self_attention.k_layernorm.weight", model.effective_kv_channels(), 0, kWhole, false});
    }
    visit(Entry{l, "self_attention.linear_proj.weight", h, q, TensorSplit::kRow, true});
    if (bias) visit(Entry{l, "self_attention.linear_proj.bias", h, 0, kWhole, false});
    norm(l, "pre_mlp_layernorm.weight", "pre_mlp_layernorm.bias");
    if (!model.moe.moe_layer(l)) {
      mlp(l, "mlp.linear_fc1.weight", "mlp.linear_fc1.bias", "mlp.linear_fc2.weight", "mlp.linear_fc2.bias", f, -1);
      continue;
    }
    // The router is no tensor-parallel layer: [experts x h] whole on every rank.
    visit(Entry{l, "mlp.router.weight", model.moe.num_experts, h, kWhole, true});
    const int64_t local = model.moe.num_experts / plan.expert_model_parallel_size;
    for (int64_t e = ep_rank * local; e < (ep_rank + 1) * local; ++e) {
      mlp(l, "linear_fc1.weight", "linear_fc1.bias", "linear_fc2.weight", "linear_fc2.bias",
          model.effective_moe_ffn_hidden_size(), e);
    }
    if (const int64_t shared = model.moe.shared_expert_intermediate_size; shared > 0) {
      mlp(l, "mlp.shared_experts.linear_fc1.weight", "mlp.shared_experts.linear_fc1.bias",
          "mlp.shared_experts.linear_fc2.weight", "mlp.shared_experts.linear_fc2.bias", shared, -1);
      if (model.moe.shared_expert_gate) visit(Entry{l, "mlp.shared_experts.gate_weight", 1, h, kWhole, true});
    }
  }
  if (layers.has_output_layer) {
    norm(-1, "decoder.final_layernorm.weight", "decoder.final_layernorm.bias");
    // Its own weight when untied, or the tied copy when the embedding sits on another rank.
    if (stage_parameters(model, plan, stage).holds_output_weight &&
        (model.untie_embeddings_and_output_weights || !layers.has_embedding)) {
      visit(Entry{-1, kOutputWeight, v, h, TensorSplit::kVocabulary, true});
    }
  }
}

// This rank's part of an entry, {rows, columns}: column- and vocabulary-parallel tensors are cut
// along rows, row-parallel ones along columns.
std::pair<int64_t, int64_t> shard_extents(const Entry& entry, int64_t tp) {
  const bool rows_cut = entry.split == TensorSplit::kColumn || entry.split == TensorSplit::kVocabulary;
  return {rows_cut ? entry.rows / tp : entry.rows,
          entry.split == TensorSplit::kRow ? entry.columns / tp : entry.columns};
}

std::vector<int64_t> shape_of(int64_t rows, int64_t columns) {
  return columns > 0 ? std::vector<int64_t>{rows, columns} : std::vector<int64_t>{rows};
}

std::size_t shard_size(const Entry& entry, int64_t tp) {
  const auto [rows, columns] = shard_extents(entry, tp);
  return static_cast<std::size_t>(columns > 0 ? rows * columns : rows);
}

}  // namespace

std::vector<ParameterSpec> describe_parameters(const ModelSpec& model, const ParallelPlan& plan, int64_t stage,
                                               int64_t tp_rank, int64_t ep_rank, int64_t etp_rank) {
  const int64_t tp = plan.tensor_parallel_size, etp = plan.expert_tensor_parallel();
  if (etp_rank < 0) {
    if (etp != tp && etp != 1) throw std::logic_error("describe_parameters: the expert tensor-parallel rank is needed");
    etp_rank = etp == tp ? tp_rank : 0;
  }
  std::vector<ParameterSpec> specs;
  for_each_parameter(model, plan, stage, ep_rank, [&](const Entry& entry) {
    // A routed expert's cut over the expert tensor-parallel group, the rest's over tp.
    const bool expert = entry.expert >= 0;
    const int64_t cut = expert ? etp : tp;
    ParameterSpec spec;
    spec.name = entry.layer >= 0 ? "decoder.layers." + std::to_string(entry.layer) + "." : "";
    if (entry.expert >= 0) spec.name += kExpertPrefix + std::to_string(entry.expert) + ".";
    spec.name += entry.name;
    spec.split = entry.split;
    spec.chunks = entry.chunks;
    if (entry.split != TensorSplit::kReplicated) {
      spec.shard_index = expert ? etp_rank : tp_rank;
      spec.shard_count = cut;
    }
    spec.global_shape = shape_of(entry.rows, entry.columns);
    const auto [rows, columns] = shard_extents(entry, cut);
    spec.shape = shape_of(rows, columns);
    spec.size = shard_size(entry, cut);
    spec.weight_decay = entry.decay;
    spec.expert = entry.expert >= 0;
    specs.push_back(std::move(spec));
  });
  return specs;
}

ParameterLayout stage_layout(const ModelSpec& model, const ParallelPlan& plan, int64_t stage, std::size_t bucket_size) {
  std::vector<std::size_t> sizes, alone;
  std::vector<bool> expert;
  for_each_parameter(model, plan, stage, 0, [&](const Entry& entry) {
    // The word embedding (or its tied copy) gets a bucket of its own.
    const std::string_view name = entry.name;
    if (name == kWordEmbeddings || name == kOutputWeight) alone.push_back(sizes.size());
    sizes.push_back(shard_size(entry, entry.expert >= 0 ? plan.expert_tensor_parallel() : plan.tensor_parallel_size));
    expert.push_back(entry.expert >= 0);
  });
  if (bucket_size == 0) bucket_size = default_bucket_size(plan.gradient_group_size());
  return layout_parameters(sizes, bucket_size, plan.gradient_group_size(), alone, expert,
                           plan.expert_data_parallel_size());
}

}  // namespace megaplan
