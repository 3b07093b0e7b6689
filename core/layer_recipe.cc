// megaplan's decoder layer: widths, choices, buffers and kernels (see layer_recipe.h).
#include "core/layer_recipe.h"

#include <algorithm>

#include "core/context_parallel.h"
#include "core/formulas.h"
#include "core/moe_kernel_list.h"

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
          model.effective_num_query_groups() / t,
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
      qk_norm(model.qk_layernorm),
      hidden_dropout(plan.options.hidden_dropout > 0),
      attention_dropout(plan.options.attention_dropout > 0),
      tensor_parallel(plan.tensor_parallel_size > 1),
      sequence_parallel(plan.sequence_parallel),
      context_parallel(plan.context_parallel_size),
      moe_imbalance(plan.moe_imbalance),
      gemm_precision(plan.options.precision),
      precision(storage) {
  if (!model.moe.enabled()) return;
  const MoeSpec& spec = model.moe;
  // Each rank routes its own tokens (under tensor parallelism its rows of the stream: MoE layers
  // run with sequence parallelism, core/executor_support.h) to every expert of the layer, and holds
  // its etp shard of each of its experts (its tp shard of the shared expert).
  const int64_t tp = plan.tensor_parallel_size, etp = plan.expert_tensor_parallel();
  const int64_t experts = spec.num_experts, topk = spec.effective_router_topk();
  const int64_t capacity =
      spec.expert_capacity_factor ? moe_expert_capacity(dims.rows, topk, experts, *spec.expert_capacity_factor) : 0;
  moe =
      moe_dims(dims.rows, dims.hidden, model.effective_moe_ffn_hidden_size() / etp,
               spec.shared_expert_intermediate_size / tp, spec.shared_expert_gate, experts, topk, capacity,
               spec.pad_expert_input_to_capacity, plan.expert_model_parallel_size, tp, plan.context_parallel_size, etp);
  moe->aux_loss = spec.load_balancing != LoadBalancing::kNone && spec.aux_loss_coeff > 0;
  // seq_aux_loss: each of the rank's sequences its own loss (whole on the rank: cp 1, tp dividing
  // the micro-batch size, core/executor_support.h).
  if (moe->aux_loss && spec.load_balancing == LoadBalancing::kSeqAuxLoss) {
    moe->aux_loss_sequences = micro_batch_size / tp;
  }
  moe->z_loss = spec.z_loss_coeff > 0;
  // Under expert parallelism the rank's experts compute what the others send: at the stated load
  // the busiest rank's rows, its buffers grown to hold them as the executor grows them.
  if (moe->expert_parallel > 1) {
    const int64_t rows = moe_stated_load(*moe, moe_imbalance).arrived_rows();
    moe->arrived_rows = moe_expert_rows(rows, moe->most_rows);
  }
}

MoeDims moe_dims(int64_t tokens, int64_t hidden, int64_t ffn, int64_t shared_ffn, bool shared_gate, int64_t experts,
                 int64_t topk, int64_t capacity, bool pad, int64_t expert_parallel, int64_t tensor_parallel,
                 int64_t context_parallel, int64_t expert_tensor_parallel) {
  MoeDims m;
  m.tokens = tokens;
  m.hidden = hidden;
  m.ffn = ffn;
  m.shared_ffn = shared_ffn;
  m.shared_gate = shared_gate && shared_ffn > 0;
  m.experts = experts;
  m.topk = topk;
  m.capacity = capacity;
  m.padded = pad && capacity > 0;
  m.most_rows = moe_most_rows(tokens, topk, experts, capacity, pad);
  m.expert_parallel = expert_parallel;
  m.tensor_parallel = tensor_parallel;
  m.expert_tensor_parallel = expert_tensor_parallel > 0 ? expert_tensor_parallel : tensor_parallel;
  m.context_parallel = context_parallel;
  // At the balanced load (or padded to capacity, exactly) as many rows arrive for a rank's experts
  // as its dispatch makes.
  m.arrived_rows = m.most_rows;
  return m;
}

int64_t moe_most_rows(int64_t tokens, int64_t topk, int64_t experts, int64_t capacity, bool pad) {
  const int64_t routes = tokens * topk;
  if (capacity == 0) return routes;
  return pad ? experts * capacity : std::min(routes, experts * capacity);
}

int64_t moe_expert_rows(int64_t rows, int64_t most_rows) {
  if (rows <= most_rows) return most_rows;
  const int64_t granule = std::max<int64_t>(1, (most_rows + 15) / 16);
  return (rows + granule - 1) / granule * granule;
}

MoeLayerBufferSizes moe_kept(const MoeDims& m) {
  MoeLayerBufferSizes kept;
  kept.logits = {m.tokens * m.experts};
  kept.expert_out = {m.most_rows * m.hidden};
  if (m.shared_ffn > 0) kept.shared_fc1_out = {m.shared_tokens() * 2 * m.shared_ffn};
  if (m.shared_gate) {
    kept.shared_out = {m.tokens * m.hidden};
    kept.gate_logits = {m.tokens};
  }
  kept.probs = {m.tokens * m.topk};
  kept.aux_counts = {m.experts};
  kept.experts = kept.token_rows = {m.tokens * m.topk};
  kept.row_tokens = {m.most_rows};
  return kept;
}

MoeExpertBufferSizes moe_expert_kept(const MoeDims& m) {
  return {{m.expert_rows() * m.hidden}, {m.expert_rows() * 2 * m.ffn}};
}

MoeScratchSizes moe_scratch(const MoeDims& m) {
  const int64_t t = m.tokens, s = m.shared_ffn, shared_rows = s > 0 ? m.shared_tokens() : 0;
  const bool tensor_parallel = m.tensor_parallel > 1;
  MoeScratchSizes scratch;
  scratch.d_expert_out = {m.most_rows * m.hidden};
  scratch.d_logits_compute = {t * m.experts};
  scratch.dx_part = {std::max(t, shared_rows) * m.hidden};
  if (s > 0) {
    scratch.shared_activated = {shared_rows * s};
    scratch.shared_out = {shared_rows * m.hidden};
    if (tensor_parallel) scratch.shared_rows = {t * m.hidden};
  }
  if (m.shared_gate) {
    scratch.d_gate_compute = {t};
    scratch.d_gate = {t};
  }
  if (m.expert_parallel > 1) scratch.sent = {m.most_rows * m.hidden};
  if (m.expert_parallel > 1 || tensor_parallel || m.context_parallel > 1) {
    scratch.counts = {m.expert_tensor_parallel * m.expert_parallel * m.experts};
  }
  scratch.d_probs = {t * m.topk};
  scratch.d_logits = {t * m.experts};
  // The balancing and z losses' running sums; under tensor parallelism each member's, gathered.
  scratch.loss_memory = {(tensor_parallel ? 1 + m.tensor_parallel : 1) * 2 * kLossSumFloats};
  return scratch;
}

MoeExpertScratchSizes moe_expert_scratch(const MoeDims& m) {
  const int64_t rows = m.expert_rows(), s = m.shared_ffn, shared_rows = s > 0 ? m.shared_tokens() : 0;
  MoeExpertScratchSizes scratch;
  scratch.activated = {rows * m.ffn};
  scratch.d_activated = {std::max(rows * m.ffn, shared_rows * s)};
  scratch.d_fc1_out = {std::max(rows * 2 * m.ffn, shared_rows * 2 * s)};
  scratch.d_rows = {rows * m.hidden};
  if (m.expert_parallel > 1) scratch.exchanged = {m.arrived_rows * m.hidden};
  if (m.expert_tensor_parallel > 1) scratch.gathered = {rows * m.hidden};
  return scratch;
}

MoeDeferredSizes moe_deferred(const MoeDims& m) {
  MoeDeferredSizes deferred;
  deferred.expert_fc2 = {m.expert_rows() * m.hidden};
  deferred.expert_fc1 = {m.expert_rows() * 2 * m.ffn};
  deferred.logits = {m.tokens * m.experts};
  if (m.shared_ffn > 0) {
    deferred.shared_fc2 = {m.shared_tokens() * m.hidden};
    deferred.shared_fc1 = {m.shared_tokens() * 2 * m.shared_ffn};
  }
  if (m.shared_gate) deferred.gate = {m.tokens};
  return deferred;
}

LayerBufferSizes LayerRecipe::kept(LayerKeep keep, bool moe_layer) const {
  const LayerDims& d = dims;
  LayerBufferSizes kept;
  if (keep == LayerKeep::kNothing) return kept;
  kept.input = {d.rows * d.hidden};
  if (keep == LayerKeep::kInput) return kept;
  kept.qkv = {d.tokens * d.qkv};
  kept.middle = {d.rows * d.hidden};
  if (!moe_layer) kept.fc1 = {d.tokens * d.fc1};
  if (!moe_layer && !swiglu) kept.activated = {d.tokens * d.ffn};
  if (!rms_norm) kept.ln1_mean = kept.ln2_mean = {d.rows};  // RMSNorm keeps no mean
  kept.ln1_rstd = kept.ln2_rstd = {d.rows};
  if (qk_norm) {
    kept.qk_input = {d.tokens * d.qkv};
    kept.qk_rstd = {d.tokens * d.qkv / d.head_dim};
  }
  if (keep == LayerKeep::kAll) {
    kept.attention = {d.tokens * d.query};
    const int64_t local_seq = seq_length / context_parallel;  // the query rows of a sequence on the rank
    const int64_t per_row = precision.attention_keeps_probabilities && context_parallel == 1 ? seq_length : 1;
    kept.attention_saved = {micro_batch_size * d.heads * local_seq * per_row};
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

DeferredGradientSizes LayerRecipe::deferred(bool moe_layer) const {
  const LayerDims& d = dims;
  if (moe_layer) return {{d.tokens * d.qkv}, {d.tokens * d.hidden}, {}, {}};
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
  // The running loss sum, then three statistics per row.
  if (last_stage) scratch.loss_memory = {kLossSumFloats + 3 * d.tokens};
  if (context_parallel > 1) {
    const ActivationElements key_values{d.tokens * 2 * d.key_value};
    scratch.ring_kv = scratch.ring_kv_next = key_values;
    scratch.ring_dkv = scratch.ring_dkv_next = scratch.ring_dkv_in = key_values;
    scratch.ring_out = {d.tokens * d.query};
  }
  return scratch;
}

bool lent_sets_hold_moe(const ModelSpec& model, int64_t first_layer, const std::vector<LayerKeep>& keeps) {
  for (std::size_t l = 0; l < keeps.size(); ++l) {
    if (model.moe.moe_layer(first_layer + static_cast<int64_t>(l)) && !keeps_moe_buffers(keeps[l])) return true;
  }
  return false;
}

MoeKernels LayerRecipe::moe_mlp_kernels() const {
  if (!moe) return {};
  return moe_kernels(*moe, moe_stated_load(*moe, moe_imbalance), precision.activation_bytes);
}

RingAttentionPasses LayerRecipe::ring_attention() const {
  if (context_parallel <= 1) return {};
  const int64_t tokens = dims.tokens, key_values = dims.tokens * 2 * dims.key_value;
  const int64_t chunk = seq_length / (2 * context_parallel), local = seq_length / context_parallel;
  RingAttentionPasses passes = ring_attention_passes(
      context_parallel, precision.activation_bytes * key_values, [&](int64_t step, bool backward) {
        std::vector<Kernel> kernels;
        // The backward's sum of this step's key and value gradients starts at zero; from the
        // second step on the sum arriving from the previous rank is added to it.
        if (backward) kernels.push_back(flat_kernel(KernelKind::kZero, key_values));
        // Every rank's step is the same work: rank 0's blocks stand for all.
        const RingStep ring = ring_step(0, step, context_parallel);
        for (int b = 0; b < ring.count; ++b) {
          kernels.push_back(attention_block_kernel(
              backward ? KernelKind::kAttentionBlockBackward : KernelKind::kAttentionBlockForward, micro_batch_size,
              chunk, dims.heads, dims.head_dim, dims.groups, attention_dropout,
              ring.blocks[static_cast<std::size_t>(b)].diagonal));
        }
        if (backward && step > 0) kernels.push_back(flat_kernel(KernelKind::kAdd, key_values));
        return kernels;
      });
  const Kernel pack = row_kernel(KernelKind::kPackKeyValues, tokens, 2 * dims.key_value);
  // Forward: the running output (fp32) and each row's log-sum-exp start empty; the output ends in
  // the compute type. Backward: the query gradients accumulate into a zeroed dqkv, the keys' and
  // values' arrive home packed.
  passes.forward.before = {pack, flat_kernel(KernelKind::kFill, tokens * dims.query),
                           flat_kernel(KernelKind::kFill, micro_batch_size * dims.heads * local)};
  passes.forward.after = {flat_kernel(KernelKind::kConvert, tokens * dims.query)};
  passes.backward.before = {pack, flat_kernel(KernelKind::kZero, tokens * dims.qkv)};
  passes.backward.after = {row_kernel(KernelKind::kUnpackKeyValueGradients, tokens, 2 * dims.key_value)};
  return passes;
}

KernelBlocks LayerRecipe::kernel_blocks(int64_t tensor_parallel_rank, const RingAttentionPasses& ring) const {
  KernelBlocks blocks;
  // Plain copies, not structured bindings: the lambdas below capture them (Clang before 16 cannot
  // capture a binding, and the fuzz build uses Debian's Clang 14).
  const int64_t count = dims.tokens, rows = dims.rows, h = dims.hidden, q = dims.query, kv = dims.key_value,
                qkv = dims.qkv, f = dims.ffn, fc1 = dims.fc1, v = dims.vocabulary, heads = dims.heads,
                dim = dims.head_dim;
  const bool bias = linear_bias;
  const GemmEpilogue qkv_epilogue = qkv_bias ? GemmEpilogue::kBias : GemmEpilogue::kNone;
  // A row-parallel layer's bias is added once, by tensor-parallel rank 0, before the sum.
  const GemmEpilogue row_bias = bias && tensor_parallel_rank == 0 ? GemmEpilogue::kBias : GemmEpilogue::kNone;
  const GemmEpilogue fc1_epilogue = fused_gelu ? GemmEpilogue::kBiasGelu
                                    : bias     ? GemmEpilogue::kBias
                                               : GemmEpilogue::kNone;
  const auto gradient_epilogue = [](bool has_bias) {
    return has_bias ? GemmEpilogue::kBiasGradient : GemmEpilogue::kNone;
  };

  const KernelKind norm_forward = rms_norm ? KernelKind::kRmsNormForward : KernelKind::kNormForward;
  const KernelKind norm_backward = rms_norm ? KernelKind::kRmsNormBackward : KernelKind::kNormBackward;
  const Kernel norm = row_kernel(norm_forward, rows, h);
  const int64_t groups = dims.groups;
  // --attention-dropout: the mask is drawn inside the attention kernels. Under context parallelism
  // the ring's kernels stand in each pass's attention.
  const std::vector<Kernel> attention =
      context_parallel > 1 ? ring.forward.kernels()
                           : std::vector<Kernel>{attention_kernel(KernelKind::kAttentionForward, micro_batch_size,
                                                                  seq_length, heads, dim, groups, attention_dropout)};
  const std::vector<Kernel> attention_backward =
      context_parallel > 1 ? ring.backward.kernels()
                           : std::vector<Kernel>{attention_kernel(KernelKind::kAttentionBackward, micro_batch_size,
                                                                  seq_length, heads, dim, groups, attention_dropout)};
  // Rotary embeddings in place on the rotated dimensions of each q and k head.
  const Kernel rotary = row_kernel(KernelKind::kRotary, count, (q + kv) / dim * rotary_dim);
  // SwiGLU apart from fc1 (GELU without biases is not in the executor: refused before training).
  const Kernel activation = row_kernel(KernelKind::kSwigluForward, count, f);
  const Kernel activation_backward = row_kernel(KernelKind::kSwigluBackward, count, f);

  // --hidden-dropout: each branch's summed output is dropped inside the norm that adds it to the
  // stream (or the stage output's add); the embedding's output and the branches' gradients pass
  // through a mask of their own.
  const Kernel dropout = row_kernel(KernelKind::kDropout, rows, h);
  const Kernel branch_norm = row_kernel(norm_forward, rows, h, true, hidden_dropout);
  // A layer's forward up to its second norm, which adds the attention branch; then its MLP.
  const auto attention_forward = [&](bool fused_input_norm) {
    std::vector<Kernel> list = {fused_input_norm ? branch_norm : norm,
                                gemm_kernel(GemmLayout::kForward, qkv_epilogue, count, qkv, h)};
    if (qk_norm) list.push_back(head_norm_kernel(KernelKind::kHeadRmsNormForward, count, heads, groups, dim));
    if (rope) list.push_back(rotary);
    list.insert(list.end(), attention.begin(), attention.end());
    list.push_back(gemm_kernel(GemmLayout::kForward, row_bias, count, h, q));
    list.push_back(branch_norm);
    return list;
  };
  std::vector<Kernel> mlp_forward = {gemm_kernel(GemmLayout::kForward, fc1_epilogue, count, fc1, h)};
  if (!fused_gelu) mlp_forward.push_back(activation);
  mlp_forward.push_back(gemm_kernel(GemmLayout::kForward, row_bias, count, h, f));
  const auto concatenated = [](std::vector<Kernel> a, const std::vector<Kernel>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  blocks[static_cast<std::size_t>(KernelBlock::kLayerForwardFirst)] =
      concatenated(attention_forward(false), mlp_forward);
  blocks[static_cast<std::size_t>(KernelBlock::kLayerForward)] = concatenated(attention_forward(true), mlp_forward);

  // The weight gradient of each GEMM, or under I the copy of its output gradient kept for W.
  const Kernel fc2_weight = gemm_kernel(GemmLayout::kWeightGradient, gradient_epilogue(bias), count, h, f);
  const Kernel fc1_weight = gemm_kernel(GemmLayout::kWeightGradient, gradient_epilogue(bias), count, fc1, h);
  const Kernel proj_weight = gemm_kernel(GemmLayout::kWeightGradient, gradient_epilogue(bias), count, h, q);
  const Kernel qkv_weight = gemm_kernel(GemmLayout::kWeightGradient, gradient_epilogue(qkv_bias), count, qkv, h);
  const auto weight_or_copy = [&](const Kernel& gemm, bool defer) {
    return defer ? flat_kernel(KernelKind::kCopy, count * gemm.n) : gemm;
  };
  // The MLP branch's gradient through its dropout, then the MLP's backward; from the second norm's
  // backward on, the attention half's.
  const auto mlp_backward = [&](bool defer) {
    std::vector<Kernel> list;
    if (hidden_dropout) list.push_back(dropout);
    list.push_back(gemm_kernel(GemmLayout::kInputGradient,
                               fused_gelu ? GemmEpilogue::kGeluGradient : GemmEpilogue::kNone, count, h, f));
    if (!fused_gelu) list.push_back(activation_backward);
    if (swiglu && !defer) list.push_back(activation);  // fc2's input again, for its weight gradient
    list.push_back(weight_or_copy(fc2_weight, defer));
    list.push_back(norm);  // recomputed, not kept
    list.push_back(gemm_kernel(GemmLayout::kInputGradient, GemmEpilogue::kNone, count, fc1, h));
    list.push_back(weight_or_copy(fc1_weight, defer));
    return list;
  };
  const auto attention_backward_half = [&](bool defer) {
    std::vector<Kernel> list = {row_kernel(norm_backward, rows, h, true)};
    if (hidden_dropout) list.push_back(dropout);  // the attention branch's gradient
    list.push_back(gemm_kernel(GemmLayout::kInputGradient, GemmEpilogue::kNone, count, h, q));
    list.push_back(weight_or_copy(proj_weight, defer));
    list.insert(list.end(), attention_backward.begin(), attention_backward.end());
    if (rope) list.push_back(rotary);
    if (qk_norm) list.push_back(head_norm_kernel(KernelKind::kHeadRmsNormBackward, count, heads, groups, dim));
    list.push_back(norm);  // recomputed, not kept
    list.push_back(gemm_kernel(GemmLayout::kInputGradient, GemmEpilogue::kNone, count, qkv, h));
    list.push_back(weight_or_copy(qkv_weight, defer));
    list.push_back(row_kernel(norm_backward, rows, h, true));
    return list;
  };
  blocks[static_cast<std::size_t>(KernelBlock::kLayerBackward)] =
      concatenated(mlp_backward(false), attention_backward_half(false));
  blocks[static_cast<std::size_t>(KernelBlock::kLayerBackwardInput)] =
      concatenated(mlp_backward(true), attention_backward_half(true));
  std::vector<Kernel>& weight_gradients = blocks[static_cast<std::size_t>(KernelBlock::kLayerWeightGradient)];
  if (swiglu) weight_gradients.push_back(activation);  // fc2's input again
  weight_gradients.insert(weight_gradients.end(), {fc2_weight, norm, fc1_weight, proj_weight, norm, qkv_weight});
  // An MoE layer: its MLP's kernels at the plan's stated load in place of the dense MLP's; its
  // backward recomputes the second norm's output, which the router and the experts read.
  if (moe) {
    const MoeKernels moe_list = moe_mlp_kernels();
    blocks[static_cast<std::size_t>(KernelBlock::kMoeLayerForwardFirst)] =
        concatenated(attention_forward(false), moe_list.forward);
    blocks[static_cast<std::size_t>(KernelBlock::kMoeLayerForward)] =
        concatenated(attention_forward(true), moe_list.forward);
    blocks[static_cast<std::size_t>(KernelBlock::kMoeLayerRecomputeFirst)] =
        concatenated(attention_forward(false), moe_list.forward_again);
    blocks[static_cast<std::size_t>(KernelBlock::kMoeLayerRecompute)] =
        concatenated(attention_forward(true), moe_list.forward_again);
    const auto moe_backward = [&](bool defer) {
      std::vector<Kernel> list;
      if (hidden_dropout) list.push_back(dropout);
      list.push_back(norm);
      return concatenated(concatenated(list, defer ? moe_list.backward_input : moe_list.backward),
                          attention_backward_half(defer));
    };
    blocks[static_cast<std::size_t>(KernelBlock::kMoeLayerBackward)] = moe_backward(false);
    blocks[static_cast<std::size_t>(KernelBlock::kMoeLayerBackwardInput)] = moe_backward(true);
    // W: the second norm again (the router's and the experts' input), the MLP's weight gradients,
    // then the attention half's as a dense layer's.
    blocks[static_cast<std::size_t>(KernelBlock::kMoeLayerWeightGradient)] =
        concatenated(concatenated({norm}, moe_list.weight), {proj_weight, norm, qkv_weight});
  }
  blocks[static_cast<std::size_t>(KernelBlock::kAttentionRecompute)] = attention;

  blocks[static_cast<std::size_t>(KernelBlock::kEmbeddingForward)] = {
      row_kernel(KernelKind::kEmbeddingForward, count, h)};
  if (hidden_dropout) {
    blocks[static_cast<std::size_t>(KernelBlock::kEmbeddingForward)].push_back(dropout);
    blocks[static_cast<std::size_t>(KernelBlock::kEmbeddingGradientDropout)] = {dropout};
  }
  blocks[static_cast<std::size_t>(KernelBlock::kEmbeddingBackward)] = {
      row_kernel(KernelKind::kEmbeddingBackward, count, h)};
  blocks[static_cast<std::size_t>(KernelBlock::kEmbeddingGradientCopy)] = {flat_kernel(KernelKind::kCopy, count * h)};
  blocks[static_cast<std::size_t>(KernelBlock::kStageOutput)] = {
      hidden_dropout ? row_kernel(KernelKind::kDropout, rows, h, true) : flat_kernel(KernelKind::kAdd, rows * h)};
  blocks[static_cast<std::size_t>(KernelBlock::kOutputGradientCopy)] = {flat_kernel(KernelKind::kCopy, rows * h)};
  blocks[static_cast<std::size_t>(KernelBlock::kInputGradientCopy)] = {flat_kernel(KernelKind::kCopy, rows * h)};

  const Kernel output_weight = gemm_kernel(GemmLayout::kWeightGradient, GemmEpilogue::kNone, count, v, h);
  // The loss merges the shards' statistics on the device (vocabulary_parallel_loss.h).
  blocks[static_cast<std::size_t>(KernelBlock::kHeadForward)] = {
      branch_norm, gemm_kernel(GemmLayout::kForward, GemmEpilogue::kNone, count, v, h),
      row_kernel(KernelKind::kCrossEntropyForward, count, v)};
  if (tensor_parallel) {
    blocks[static_cast<std::size_t>(KernelBlock::kHeadForward)].push_back(
        flat_kernel(KernelKind::kCrossEntropyShift, count));
  }
  blocks[static_cast<std::size_t>(KernelBlock::kHeadForward)].push_back(
      flat_kernel(KernelKind::kCrossEntropyFinish, count));
  const Kernel loss_backward = row_kernel(KernelKind::kCrossEntropyBackward, count, v);
  const Kernel output_input = gemm_kernel(GemmLayout::kInputGradient, GemmEpilogue::kNone, count, v, h);
  const Kernel final_norm_backward = row_kernel(norm_backward, rows, h);
  blocks[static_cast<std::size_t>(KernelBlock::kHeadBackward)] = {loss_backward, output_input, output_weight,
                                                                  final_norm_backward};
  blocks[static_cast<std::size_t>(KernelBlock::kHeadBackwardInput)] = {loss_backward, output_input,
                                                                       final_norm_backward};
  blocks[static_cast<std::size_t>(KernelBlock::kHeadWeightGradient)] = {output_weight};
  // Under --fp16 the GEMMs take fp16 operands (the profile times them so); attention and the
  // memory-bound kernels run at the same rate in either 16-bit type, so their rows serve both.
  for (std::vector<Kernel>& block : blocks) {
    for (Kernel& kernel : block) {
      if (kernel.kind == KernelKind::kGemm) kernel.precision = gemm_precision;
    }
  }
  return blocks;
}

}  // namespace megaplan
