// Parameter and FLOP formulas.
#include "core/formulas.h"

#include "core/pipeline_layout.h"

namespace megaplan {

namespace {

int64_t norm_parameters(const ModelSpec& model) {
  // LayerNorm has a weight and a bias; RMSNorm only a weight.
  return model.normalization == Normalization::kLayerNorm ? 2 * model.hidden_size : model.hidden_size;
}

// --qk-layernorm: each query head's norm and each key head's, over head_dim (RMSNorm: a weight each).
int64_t qk_norm_parameters(const ModelSpec& model) {
  return model.qk_layernorm ? 2 * model.effective_kv_channels() : 0;
}

int64_t position_embedding_parameters(const ModelSpec& model) {
  return model.position_embedding_type == PositionEmbedding::kLearnedAbsolute
             ? model.effective_max_position_embeddings() * model.hidden_size
             : 0;
}

// One MLP of width `ffn`: fc1 (two halves with SwiGLU) and fc2, with their biases where the model
// has linear biases. Column-parallel fc1 is sharded with its bias; row-parallel fc2's weight is
// sharded and its bias replicated.
struct MlpParameters {
  int64_t total = 0;
  int64_t sharded = 0;
  int64_t replicated = 0;
  int64_t expert_sharded = 0;  // of sharded and replicated, the routed experts' (ep splits them)
  int64_t expert_replicated = 0;
};
MlpParameters mlp_parameters(const ModelSpec& model, int64_t ffn) {
  const int64_t h = model.hidden_size;
  const int64_t ffn_in = (model.swiglu ? 2 : 1) * ffn;
  const int64_t fc1_bias = model.add_bias_linear ? ffn_in : 0;
  const int64_t fc2_bias = model.add_bias_linear ? h : 0;
  return {h * ffn_in + fc1_bias + ffn * h + fc2_bias, h * ffn_in + fc1_bias + ffn * h, fc2_bias, 0, 0};
}

// A layer's MLP: the dense one, or in a layer with experts the router (replicated: Megatron's
// router is no tensor-parallel layer), every expert (sharded over etp, tp by default) and the
// shared expert (over tp) with its gate (1 x h, replicated).
MlpParameters layer_mlp_parameters(const ModelSpec& model, bool experts) {
  if (!experts) return mlp_parameters(model, model.effective_ffn_hidden_size());
  const MlpParameters expert = mlp_parameters(model, model.effective_moe_ffn_hidden_size());
  const MlpParameters shared = model.moe.shared_expert_intermediate_size > 0
                                   ? mlp_parameters(model, model.moe.shared_expert_intermediate_size)
                                   : MlpParameters{};
  const int64_t gate = model.moe.shared_expert_gate ? model.hidden_size : 0;
  const int64_t count = model.moe.num_experts;
  const int64_t router = count * model.hidden_size;
  return {count * expert.total + shared.total + gate + router, count * expert.sharded + shared.sharded,
          count * expert.replicated + shared.replicated + gate + router, count * expert.sharded,
          count * expert.replicated};
}

}  // namespace

LayerParameters transformer_layer_parameters(const ModelSpec& model, bool experts) {
  const int64_t h = model.hidden_size;
  const int64_t qkv_width = model.query_projection_size() + 2 * model.kv_projection_size();
  const bool bias = model.add_bias_linear;

  LayerParameters layer;
  // Column-parallel (sharded with its bias): QKV. Row-parallel (weight sharded, bias replicated):
  // the output projection.
  const int64_t qkv_bias = bias || model.add_qkv_bias ? qkv_width : 0;
  const int64_t projection_bias = bias ? h : 0;
  const MlpParameters mlp = layer_mlp_parameters(model, experts && model.moe.enabled());
  layer.attention = h * qkv_width + qkv_bias + model.query_projection_size() * h + projection_bias;
  layer.mlp = mlp.total;
  // --qk-layernorm: a query and a key norm over head_dim each, whole on every tensor-parallel rank.
  layer.norms = 2 * norm_parameters(model) + qk_norm_parameters(model);
  layer.sharded = h * qkv_width + qkv_bias + model.query_projection_size() * h + mlp.sharded;
  layer.replicated = projection_bias + mlp.replicated + layer.norms;
  layer.expert_sharded = mlp.expert_sharded;
  layer.expert_replicated = mlp.expert_replicated;
  return layer;
}

int64_t total_parameters(const ModelSpec& model, int64_t tensor_parallel_size) {
  const int64_t word_embedding = padded_vocab_size(model, tensor_parallel_size) * model.hidden_size;
  const int64_t output_layer = model.untie_embeddings_and_output_weights ? word_embedding : 0;
  const int64_t moe_layers = model.moe.moe_layers(0, model.num_layers);
  return (model.num_layers - moe_layers) * transformer_layer_parameters(model, false).total() +
         moe_layers * transformer_layer_parameters(model, true).total() + word_embedding +
         position_embedding_parameters(model) + norm_parameters(model) + output_layer;
}

int64_t active_parameters(const ModelSpec& model, int64_t tensor_parallel_size) {
  const int64_t total = total_parameters(model, tensor_parallel_size);
  if (!model.moe.enabled()) return total;
  const int64_t idle = model.moe.num_experts - model.moe.effective_router_topk();
  return total - model.moe.moe_layers(0, model.num_layers) * idle *
                     mlp_parameters(model, model.effective_moe_ffn_hidden_size()).total;
}

StageParameters stage_parameters(const ModelSpec& model, const ParallelPlan& plan, int64_t stage) {
  const int64_t tp = plan.tensor_parallel_size;
  const int64_t pp = plan.pipeline_parallel_size;
  const int64_t word_embedding = padded_vocab_size(model, tp) * model.hidden_size;  // vocab-parallel
  const int64_t position_embedding = position_embedding_parameters(model);          // replicated
  const StageLayers layers = stage_layers(stage, model, plan);
  StageParameters entry;
  const int64_t moe_layers = model.moe.moe_layers(layers.first_layer, layers.num_layers);
  for (const auto& [count, experts] : {std::pair{layers.num_layers - moe_layers, false}, std::pair{moe_layers, true}}) {
    if (count == 0) continue;
    const LayerParameters layer = transformer_layer_parameters(model, experts);
    entry.parameters += count * layer.total();
    const int64_t ep = plan.expert_model_parallel_size, etp = plan.expert_tensor_parallel();
    entry.parameters_per_gpu += count * layer.per_gpu(tp, ep, etp);
    entry.expert_per_gpu += count * (layer.expert_sharded / (etp * ep) + layer.expert_replicated / ep);
  }
  if (layers.has_embedding) {
    entry.parameters += word_embedding + position_embedding;
    entry.parameters_per_gpu += word_embedding / tp + position_embedding;
    entry.word_embedding_per_gpu = word_embedding / tp;
  }
  if (layers.has_output_layer) {
    // The output layer is its own weight when untied, and a synchronised copy of the word
    // embeddings when tied and the embedding lives on another rank; on the same rank (one
    // stage, or the turn of a V) it reads the embedding itself.
    const StagePlacement placement = stage_placement(plan.schedule);
    const bool same_rank = pipeline_rank_of_stage(0, pp, placement) == pipeline_rank_of_stage(stage, pp, placement);
    entry.holds_output_weight = model.untie_embeddings_and_output_weights || !same_rank;
    const int64_t output = entry.holds_output_weight ? word_embedding : 0;
    entry.parameters += norm_parameters(model) + output;
    entry.parameters_per_gpu += norm_parameters(model) + output / tp;
  }
  return entry;
}

std::vector<PipelineRankParameters> parameters_per_pipeline_rank(const ModelSpec& model, const ParallelPlan& plan) {
  const int64_t pp = plan.pipeline_parallel_size;
  std::vector<PipelineRankParameters> ranks(static_cast<std::size_t>(pp));
  for (int64_t rank = 0; rank < pp; ++rank) ranks[static_cast<std::size_t>(rank)].pipeline_rank = rank;
  // Each stage added to its rank in one pass (asking each rank for its stages costs pp x stages).
  const StagePlacement placement = stage_placement(plan.schedule);
  for (int64_t stage = 0; stage < plan.num_virtual_stages(); ++stage) {
    PipelineRankParameters& entry = ranks[static_cast<std::size_t>(pipeline_rank_of_stage(stage, pp, placement))];
    const StageLayers layers = stage_layers(stage, model, plan);
    const StageParameters held = stage_parameters(model, plan, stage);
    entry.num_layers += layers.num_layers;
    entry.has_embedding = entry.has_embedding || layers.has_embedding;
    entry.has_output_layer = entry.has_output_layer || layers.has_output_layer;
    entry.parameters += held.parameters;
    entry.parameters_per_gpu += held.parameters_per_gpu;
    entry.expert_per_gpu += held.expert_per_gpu;
  }
  return ranks;
}

const ParametersPerGpuCache::Entry& ParametersPerGpuCache::entry(const ParallelPlan& plan) const {
  const PipelineSplit& split = plan.pipeline_split;
  const Key key{plan.tensor_parallel_size,      plan.pipeline_parallel_size, plan.virtual_pipeline_parallel_size,
                stage_placement(plan.schedule), split.first_stage_layers,    split.last_stage_layers,
                split.account_for_embedding,    split.account_for_loss,      plan.expert_model_parallel_size,
                plan.expert_tensor_parallel()};
  const std::lock_guard<std::mutex> lock(mutex_);
  auto found = by_layout_.find(key);
  if (found == by_layout_.end()) {
    Entry per_rank;
    for (const PipelineRankParameters& rank : parameters_per_pipeline_rank(model_, plan)) {
      per_rank.parameters.push_back(rank.parameters_per_gpu);
      per_rank.experts.push_back(rank.expert_per_gpu);
    }
    found = by_layout_.emplace(key, std::move(per_rank)).first;
  }
  return found->second;  // std::map's nodes stay where they are as others are added
}

double model_flops(const ModelSpec& model, int64_t batch_size, int64_t padded_vocab_size) {
  const double h = static_cast<double>(model.hidden_size);
  const double s = static_cast<double>(model.seq_length);
  const double l = static_cast<double>(model.num_layers);
  const double heads = static_cast<double>(model.num_attention_heads);
  const double groups = static_cast<double>(model.effective_num_query_groups());
  const double query_ratio = static_cast<double>(model.query_projection_size()) / h;
  // In a layer with experts each token passes through its top k and the shared expert (Megatron's
  // count; the router's small GEMM is not counted): the layers' mean width.
  const int64_t moe_layers = model.moe.moe_layers(0, model.num_layers);
  const double mlp_width =
      (static_cast<double>(model.num_layers - moe_layers) * static_cast<double>(model.effective_ffn_hidden_size()) +
       static_cast<double>(moe_layers) *
           static_cast<double>(model.effective_moe_ffn_hidden_size() * model.moe.effective_router_topk() +
                               model.moe.shared_expert_intermediate_size)) /
      l;
  const double mlp_ratio = mlp_width / h;
  const double gated_multiplier = model.swiglu ? 1.5 : 1.0;
  const double vocab = static_cast<double>(padded_vocab_size);
  // 12 = 3 (forward + backward) x 2 (FLOPs per multiply-add) x 2 (two GEMMs per block).
  const double attention = (1.0 + groups / heads + s / h) * query_ratio;
  const double mlp = mlp_ratio * gated_multiplier;
  const double logits = vocab / (2.0 * l * h);
  return 12.0 * static_cast<double>(batch_size) * s * l * h * h * (attention + mlp + logits);
}

double hardware_flops(const ModelSpec& model, int64_t batch_size, int64_t padded_vocab_size,
                      RecomputeGranularity recompute) {
  const double total = model_flops(model, batch_size, padded_vocab_size);
  const double batch = static_cast<double>(batch_size);
  const double s = static_cast<double>(model.seq_length);
  const double l = static_cast<double>(model.num_layers);
  switch (recompute) {
    case RecomputeGranularity::kNone: return total;
    case RecomputeGranularity::kSelective:
      // Forward QK^T and AV: 2 GEMMs of 2 * b * s^2 * (query projection) FLOPs per layer.
      return total + 4.0 * batch * s * s * l * static_cast<double>(model.query_projection_size());
    case RecomputeGranularity::kFull:
      // One more forward of the transformer layers (a third of their forward + backward FLOPs);
      // the output layer is not recomputed. A zero vocabulary leaves only the layers' FLOPs.
      return total + model_flops(model, batch_size, 0) / 3.0;
  }
  return total;
}

}  // namespace megaplan
