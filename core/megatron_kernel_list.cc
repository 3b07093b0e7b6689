// Megatron-LM's kernel lists, by the plan's ImplementationOptions. What each layer launches was
// read from Megatron-LM's source (megatron/core/transformer: attention, dot_product_attention,
// mlp, transformer_layer; fusions/fused_bias_gelu, fused_bias_dropout, fused_softmax;
// tensor_parallel/layers and cross_entropy; the legacy model's language_model): the layer order,
// which linear layers skip their bias add (the row-parallel ones and fc1 under bias-GELU fusion)
// and where the fp32 cross entropy casts. Byte counts per element: a = 2 (bf16 or fp16), masks 1.
#include "core/formulas.h"
#include "core/kernel_list.h"
#include "core/layer_recipe.h"

namespace megaplan {

namespace {

constexpr int64_t kMask = 1;  // a dropout mask element (bool)

}  // namespace

// Transformer Engine's p2p ring (attn_forward_func_with_cp): step 0 one causal flash attention over
// the rank's two chunks; every later step one unmasked flash attention of a chunk's work against
// the other (both query chunks against one key chunk, or one against both), the same work as two
// of core/context_parallel.h's unmasked chunk blocks, costed as such. Its corrections of the
// output by each step's log-sum-exp are not listed.
RingAttentionPasses megatron_ring_attention(const ModelSpec& model, const ParallelPlan& plan) {
  const int64_t cp = plan.context_parallel_size;
  if (cp <= 1) return {};
  const LayerDims dims = layer_dims(model, plan);
  const int64_t batch = plan.micro_batch_size, chunk = model.seq_length / (2 * cp), heads = dims.heads,
                dim = dims.head_dim;
  const DType precision = plan.options.precision;
  const int64_t key_value_bytes = 2 * dims.tokens * 2 * dims.key_value;
  return ring_attention_passes(cp, key_value_bytes, [=](int64_t step, bool backward) {
    std::vector<Kernel> kernels;
    if (step == 0) {
      kernels.push_back(attention_kernel(backward ? KernelKind::kAttentionBackward : KernelKind::kAttentionForward,
                                         batch, 2 * chunk, heads, dim));
    } else {
      for (int i = 0; i < 2; ++i) {
        kernels.push_back(
            attention_block_kernel(backward ? KernelKind::kAttentionBlockBackward : KernelKind::kAttentionBlockForward,
                                   batch, chunk, heads, dim, heads, false, false));
      }
    }
    for (Kernel& kernel : kernels) kernel.precision = precision;
    return kernels;
  });
}

KernelBlocks megatron_kernel_blocks(const ModelSpec& model, const ParallelPlan& plan, const RingAttentionPasses& ring) {
  const ImplementationOptions& options = plan.options;
  const int64_t a = 2;
  const int64_t t = plan.tensor_parallel_size;
  // Plain copies, not structured bindings: the lambdas below capture them (Clang before 16 cannot
  // capture a binding, and the fuzz build uses Debian's Clang 14).
  const LayerDims dims = layer_dims(model, plan);
  const int64_t count = dims.tokens, rows = dims.rows, h = dims.hidden, q = dims.query, kv = dims.key_value,
                qkv = dims.qkv, f = dims.ffn, fc1 = dims.fc1, v = dims.vocabulary, heads = dims.heads,
                dim = dims.head_dim;
  // Attention over the whole sequence, or under context parallelism Transformer Engine's ring
  // (megatron_ring_attention; unfused attention never meets cp, which Megatron runs in Transformer
  // Engine only).
  const int64_t seq = model.seq_length;
  const bool bias = model.add_bias_linear;
  const bool qkv_bias = bias || model.add_qkv_bias;
  const bool rope = model.position_embedding_type == PositionEmbedding::kRope;
  const bool hidden_dropout = options.hidden_dropout > 0;
  const bool attention_dropout = options.attention_dropout > 0;

  const auto gemm = [&](GemmLayout layout, GemmEpilogue epilogue, int64_t m, int64_t n, int64_t k) {
    Kernel kernel = gemm_kernel(layout, epilogue, m, n, k);
    kernel.precision = options.precision;
    return kernel;
  };
  const auto attention = [&](KernelKind kind) {
    Kernel kernel = attention_kernel(kind, plan.micro_batch_size, seq, heads, dim);
    kernel.precision = options.precision;
    return kernel;
  };
  // One strided-batched GEMM per head and sequence of the microbatch (unfused attention).
  const auto batched = [&](int64_t m, int64_t n, int64_t k) {
    Kernel kernel = gemm(GemmLayout::kForward, GemmEpilogue::kNone, m, n, k);
    kernel.batch = plan.micro_batch_size * heads;
    return kernel;
  };
  const int64_t scores = plan.micro_batch_size * heads * seq * seq;  // the s x s scores' elements

  // Without gradient-accumulation fusion a weight GEMM writes a bf16/fp16 gradient and a kernel of
  // its own adds it into the fp32 (or fp16) main gradient: main read and written, gradient read.
  const auto weight_gradient = [&](GemmEpilogue epilogue, int64_t n, int64_t k) {
    std::vector<Kernel> list = {gemm(GemmLayout::kWeightGradient, epilogue, count, n, k)};
    if (!options.gradient_accumulation_fusion) {
      list.push_back(streaming_kernel(n * k, 2 * main_gradient_bytes(options) + a));
    }
    return list;
  };
  const auto append = [](std::vector<Kernel>& list, const std::vector<Kernel>& more) {
    list.insert(list.end(), more.begin(), more.end());
  };

  // Rotary embeddings on q and k: Transformer Engine's fused kernel reads and writes once; the local
  // path's rotate-half, two products and a sum take four passes.
  const int64_t rotary_bytes = options.transformer_impl == TransformerImpl::kTransformerEngine ? 2 * a : 10 * a;
  const Kernel rotary = streaming_kernel(count * (q + kv), rotary_bytes);

  // The attention core, from Q, K, V to the context (also what selective recomputation reruns).
  std::vector<Kernel> core_forward, core_backward;
  if (plan.context_parallel_size > 1) {
    core_forward = ring.forward.kernels();
    core_backward = ring.backward.kernels();
  } else if (fused_attention(options)) {
    core_forward = {attention(KernelKind::kAttentionForward)};
    core_backward = {attention(KernelKind::kAttentionBackward)};
  } else {
    // Grouped queries: K and V repeated to every head of their group, and summed back.
    if (kv < q) core_forward = {streaming_kernel(count * q, 2 * a), streaming_kernel(count * q, 2 * a)};
    core_forward.push_back(batched(seq, seq, dim));  // Q K^T (the scale rides on baddbmm's alpha)
    if (options.masked_softmax_fusion) {
      core_forward.push_back(streaming_kernel(scores, 2 * a));  // scaled masked softmax
    } else {
      core_forward.push_back(streaming_kernel(scores, 2 * a));  // masked fill
      core_forward.push_back(streaming_kernel(scores, 2 * a));  // softmax
    }
    if (attention_dropout) core_forward.push_back(streaming_kernel(scores, 2 * a + kMask));
    core_forward.push_back(batched(seq, dim, seq));                     // probabilities x V
    core_forward.push_back(flat_kernel(KernelKind::kCopy, count * q));  // context to [s, b, h]

    core_backward.push_back(flat_kernel(KernelKind::kCopy, count * q));
    core_backward.push_back(batched(seq, seq, dim));  // d probabilities = d context x V^T
    core_backward.push_back(batched(seq, dim, seq));  // dV = probabilities^T x d context
    if (attention_dropout) core_backward.push_back(streaming_kernel(scores, 2 * a + kMask));
    core_backward.push_back(streaming_kernel(scores, 3 * a));  // softmax backward: y, dy in, dx out
    if (!options.masked_softmax_fusion) core_backward.push_back(streaming_kernel(scores, 2 * a));  // masked fill
    core_backward.push_back(batched(seq, dim, seq));                                               // dQ = d scores x K
    core_backward.push_back(batched(seq, dim, seq));  // dK = d scores^T x Q
    if (kv < q) {
      core_backward.push_back(streaming_kernel(count * q, 2 * a));
      core_backward.push_back(streaming_kernel(count * q, 2 * a));
    }
  }

  // Bias, dropout and the residual add after each branch: one fused pass (x, residual in; sum and
  // mask out), or the bias add, the dropout and the add apart. Its backward: the dropout's, and
  // the bias gradient as a column sum.
  std::vector<Kernel> branch_end, branch_end_backward;
  if (options.bias_dropout_fusion) {
    branch_end = {streaming_kernel(rows * h, 3 * a + (hidden_dropout ? kMask : 0))};
  } else {
    if (bias) branch_end.push_back(streaming_kernel(rows * h, 2 * a));
    if (hidden_dropout) branch_end.push_back(streaming_kernel(rows * h, 2 * a + kMask));
    branch_end.push_back(flat_kernel(KernelKind::kAdd, rows * h));
  }
  if (hidden_dropout) branch_end_backward.push_back(streaming_kernel(rows * h, 2 * a + kMask));
  if (bias) branch_end_backward.push_back(streaming_kernel(rows * h, a));

  // fc1's activation: GELU with its bias in one pass under bias-GELU fusion (fc1 then skips its
  // bias), else fc1 adds the bias and GELU runs alone; SwiGLU reads both halves.
  const bool fused_bias_gelu = options.bias_gelu_fusion && bias && !model.swiglu;
  const GemmEpilogue fc1_epilogue = bias && !fused_bias_gelu ? GemmEpilogue::kBias : GemmEpilogue::kNone;
  const Kernel activation = streaming_kernel(count * f, model.swiglu ? 3 * a : 2 * a);
  std::vector<Kernel> activation_backward = {streaming_kernel(count * f, model.swiglu ? 5 * a : 3 * a)};
  if (bias) activation_backward.push_back(streaming_kernel(count * fc1, a));  // fc1's bias gradient

  const Kernel norm = row_kernel(KernelKind::kNormForward, rows, h);
  const Kernel norm_backward = row_kernel(KernelKind::kNormBackward, rows, h);
  const Kernel residual_gradient = flat_kernel(KernelKind::kAdd, rows * h);  // the norm's dx into the stream's

  // --qk-layernorm: Megatron's q_layernorm over the query heads and k_layernorm over the key heads,
  // each a norm over rows of head_dim.
  const std::vector<Kernel> qk_norms =
      model.qk_layernorm ? std::vector<Kernel>{row_kernel(KernelKind::kNormForward, count * heads, dim),
                                               row_kernel(KernelKind::kNormForward, count * dims.groups, dim)}
                         : std::vector<Kernel>{};
  const std::vector<Kernel> qk_norms_backward =
      model.qk_layernorm ? std::vector<Kernel>{row_kernel(KernelKind::kNormBackward, count * dims.groups, dim),
                                               row_kernel(KernelKind::kNormBackward, count * heads, dim)}
                         : std::vector<Kernel>{};
  std::vector<Kernel> forward = {
      norm, gemm(GemmLayout::kForward, qkv_bias ? GemmEpilogue::kBias : GemmEpilogue::kNone, count, qkv, h)};
  append(forward, qk_norms);
  if (rope) forward.push_back(rotary);
  append(forward, core_forward);
  forward.push_back(gemm(GemmLayout::kForward, GemmEpilogue::kNone, count, h, q));
  append(forward, branch_end);
  forward.push_back(norm);
  forward.push_back(gemm(GemmLayout::kForward, fc1_epilogue, count, fc1, h));
  forward.push_back(activation);
  forward.push_back(gemm(GemmLayout::kForward, GemmEpilogue::kNone, count, h, f));
  append(forward, branch_end);

  const std::vector<Kernel> fc2_weight = weight_gradient(GemmEpilogue::kNone, h, f);
  const std::vector<Kernel> fc1_weight = weight_gradient(GemmEpilogue::kNone, fc1, h);
  const std::vector<Kernel> proj_weight = weight_gradient(GemmEpilogue::kNone, h, q);
  const std::vector<Kernel> qkv_weight =
      weight_gradient(qkv_bias ? GemmEpilogue::kBiasGradient : GemmEpilogue::kNone, qkv, h);
  const auto layer_backward = [&](bool with_weights) {
    std::vector<Kernel> list = branch_end_backward;
    list.push_back(gemm(GemmLayout::kInputGradient, GemmEpilogue::kNone, count, h, f));
    if (with_weights) append(list, fc2_weight);
    append(list, activation_backward);
    list.push_back(gemm(GemmLayout::kInputGradient, GemmEpilogue::kNone, count, fc1, h));
    if (with_weights) append(list, fc1_weight);
    list.push_back(norm_backward);
    list.push_back(residual_gradient);
    append(list, branch_end_backward);
    list.push_back(gemm(GemmLayout::kInputGradient, GemmEpilogue::kNone, count, h, q));
    if (with_weights) append(list, proj_weight);
    append(list, core_backward);
    if (rope) list.push_back(rotary);
    append(list, qk_norms_backward);
    list.push_back(gemm(GemmLayout::kInputGradient, GemmEpilogue::kNone, count, qkv, h));
    if (with_weights) append(list, qkv_weight);
    list.push_back(norm_backward);
    list.push_back(residual_gradient);
    return list;
  };
  std::vector<Kernel> layer_weights = fc2_weight;
  append(layer_weights, fc1_weight);
  append(layer_weights, proj_weight);
  append(layer_weights, qkv_weight);

  KernelBlocks blocks;
  const auto set = [&](KernelBlock block, std::vector<Kernel> list) {
    blocks[static_cast<std::size_t>(block)] = std::move(list);
  };
  set(KernelBlock::kLayerForwardFirst, forward);  // Megatron's norms never add the previous branch
  set(KernelBlock::kLayerForward, forward);
  set(KernelBlock::kLayerBackward, layer_backward(true));
  set(KernelBlock::kLayerBackwardInput, layer_backward(false));
  set(KernelBlock::kLayerWeightGradient, layer_weights);
  set(KernelBlock::kAttentionRecompute, core_forward);

  // The embedding: word rows gathered (rows outside this tp rank's vocabulary zeroed), the learned
  // positions added, [b, s] to [s, b] and the embedding dropout. Its backward accumulates a dense
  // gradient of the whole table (torch's embedding backward) into the main gradient.
  const bool learned_positions = model.position_embedding_type == PositionEmbedding::kLearnedAbsolute;
  const int64_t positions = model.max_position_embeddings;
  std::vector<Kernel> embedding = {streaming_kernel(count * h, 2 * a)};
  if (t > 1) embedding.push_back(streaming_kernel(count * h, 2 * a));
  if (learned_positions) {
    embedding.push_back(streaming_kernel(count * h, 2 * a));
    embedding.push_back(flat_kernel(KernelKind::kAdd, count * h));
  }
  embedding.push_back(flat_kernel(KernelKind::kCopy, count * h));
  if (hidden_dropout) embedding.push_back(streaming_kernel(count * h, 2 * a + kMask));
  std::vector<Kernel> embedding_backward;
  if (hidden_dropout) embedding_backward.push_back(streaming_kernel(count * h, 2 * a + kMask));
  embedding_backward.push_back(flat_kernel(KernelKind::kCopy, count * h));
  const auto table_gradient = [&](int64_t table_rows) {
    const int64_t accumulate = 2 * main_gradient_bytes(options) + a;
    return std::vector<Kernel>{streaming_kernel(table_rows * h, a), streaming_kernel(count * h, 3 * a),
                               streaming_kernel(table_rows * h, accumulate)};
  };
  if (t > 1) embedding_backward.push_back(streaming_kernel(count * h, 2 * a));
  append(embedding_backward, table_gradient(v));
  if (learned_positions) append(embedding_backward, table_gradient(positions));
  set(KernelBlock::kEmbeddingForward, embedding);
  set(KernelBlock::kEmbeddingBackward, embedding_backward);

  // The output layer and the vocabulary-parallel cross entropy, in fp32: logits to [b, s], cast,
  // row max, shift, exp, row sum, and the softmax kept for the backward, each a pass over the
  // shard; the backward scales the softmax and casts it back for the GEMMs.
  const int64_t logits = count * v;
  const std::vector<Kernel> loss = {flat_kernel(KernelKind::kCopy, logits), streaming_kernel(logits, a + kFp32),
                                    streaming_kernel(logits, kFp32),        streaming_kernel(logits, 2 * kFp32),
                                    streaming_kernel(logits, 2 * kFp32),    streaming_kernel(logits, kFp32),
                                    streaming_kernel(logits, 2 * kFp32)};
  const std::vector<Kernel> loss_backward = {streaming_kernel(logits, 2 * kFp32), streaming_kernel(logits, kFp32 + a),
                                             flat_kernel(KernelKind::kCopy, logits)};
  std::vector<Kernel> head = {norm, gemm(GemmLayout::kForward, GemmEpilogue::kNone, count, v, h)};
  append(head, loss);
  set(KernelBlock::kHeadForward, head);
  const std::vector<Kernel> output_weight = weight_gradient(GemmEpilogue::kNone, v, h);
  std::vector<Kernel> head_backward = loss_backward;
  head_backward.push_back(gemm(GemmLayout::kInputGradient, GemmEpilogue::kNone, count, v, h));
  std::vector<Kernel> head_backward_input = head_backward;
  append(head_backward, output_weight);
  head_backward.push_back(norm_backward);
  head_backward_input.push_back(norm_backward);
  set(KernelBlock::kHeadBackward, head_backward);
  set(KernelBlock::kHeadBackwardInput, head_backward_input);
  set(KernelBlock::kHeadWeightGradient, output_weight);
  // Megatron sends and receives the hidden states as they are: no boundary kernels, and I keeps
  // the embedding's backward for W without a copy.
  return blocks;
}

}  // namespace megaplan
