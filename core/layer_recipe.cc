// megaplan's decoder layer: widths, choices and buffers (see layer_recipe.h).
#include "core/layer_recipe.h"

#include <algorithm>

#include "core/formulas.h"

namespace megaplan {

LayerDims layer_dims(const ModelSpec& model, const ParallelPlan& plan) {
  const int64_t t = plan.tensor_parallel_size;
  const int64_t tokens = tokens_per_microbatch(model, plan);
  const int64_t query = model.query_projection_size() / t;
  const int64_t key_value = model.kv_projection_size() / t;
  const int64_t ffn = model.effective_ffn_hidden_size() / t;
  return {tokens,
          plan.sequence_parallel ? tokens / t : tokens,
          model.hidden_size,
          query,
          key_value,
          query + 2 * key_value,
          ffn,
          model.swiglu ? 2 * ffn : ffn,
          padded_vocab_size(model, t) / t,
          model.num_attention_heads / t,
          model.effective_kv_channels()};
}

LayerRecipe::LayerRecipe(const ModelSpec& model, const ParallelPlan& plan, const ExecutorPrecision& storage)
    : dims(layer_dims(model, plan)),
      micro_batch_size(plan.micro_batch_size),
      seq_length(model.seq_length),
      rms_norm(model.normalization == Normalization::kRMSNorm),
      swiglu(model.swiglu),
      fused_gelu(!model.swiglu && model.add_bias_linear),
      rope(model.position_embedding_type == PositionEmbedding::kRope),
      rotary_dim(model.rotary_dim()),
      linear_bias(model.add_bias_linear),
      qkv_bias(model.add_bias_linear || model.add_qkv_bias),
      hidden_dropout(plan.options.hidden_dropout > 0),
      attention_dropout(plan.options.attention_dropout > 0),
      sequence_parallel(plan.sequence_parallel),
      precision(storage) {}

LayerBufferSizes LayerRecipe::kept(LayerKeep keep) const {
  const LayerDims& d = dims;
  LayerBufferSizes kept;
  if (keep == LayerKeep::kNothing) return kept;
  kept.input = {d.rows * d.hidden};
  if (keep == LayerKeep::kInput) return kept;
  kept.qkv = {d.tokens * d.qkv};
  kept.middle = {d.rows * d.hidden};
  kept.fc1 = {d.tokens * d.fc1};
  if (!swiglu) kept.activated = {d.tokens * d.ffn};
  if (!rms_norm) kept.ln1_mean = kept.ln2_mean = {d.rows};  // RMSNorm keeps no mean
  kept.ln1_rstd = kept.ln2_rstd = {d.rows};
  if (keep == LayerKeep::kAll) {
    kept.attention = {d.tokens * d.query};
    const int64_t per_row = precision.attention_keeps_probabilities ? seq_length : 1;
    kept.attention_saved = {micro_batch_size * d.heads * seq_length * per_row};
  }
  return kept;
}

MicrobatchBufferSizes LayerRecipe::microbatch(bool last_stage) const {
  const LayerDims& d = dims;
  MicrobatchBufferSizes buffers;
  buffers.output = {d.rows * d.hidden};
  if (!last_stage) return buffers;
  buffers.final_norm = {d.tokens * d.hidden};
  buffers.logits = {d.tokens * d.vocabulary};
  if (!rms_norm) buffers.final_mean = {d.rows};
  buffers.final_rstd = {d.rows};
  buffers.loss_saved = {d.tokens};  // the whole vocabulary's log-sum-exp per row
  return buffers;
}

DeferredGradientSizes LayerRecipe::deferred() const {
  const LayerDims& d = dims;
  return {{d.tokens * d.qkv}, {d.tokens * d.hidden}, {d.tokens * d.fc1}, {d.tokens * d.hidden}};
}

ChunkScratchSizes LayerRecipe::scratch(bool last_stage) const {
  const LayerDims& d = dims;
  const ActivationElements stream{d.rows * d.hidden};
  ChunkScratchSizes scratch;
  scratch.norm_out = scratch.branch_out = scratch.d_out = scratch.d_middle = stream;
  scratch.d_hidden = {d.tokens * std::max(d.hidden, d.query)};
  scratch.d_qkv = {d.tokens * d.qkv};
  scratch.d_ffn = {d.tokens * d.fc1};
  if (swiglu) scratch.swiglu_out = scratch.d_activated = {d.tokens * d.ffn};
  if (sequence_parallel) scratch.gathered = scratch.partial = {d.tokens * d.hidden};
  // The running loss sum (a double: two floats), then three statistics per row.
  if (last_stage) scratch.loss_memory = {2 + 3 * d.tokens};
  return scratch;
}

}  // namespace megaplan
