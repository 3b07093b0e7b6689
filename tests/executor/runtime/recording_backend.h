// A CPU backend that also writes down every kernel it runs, as core's kernel list describes one
// (core/kernel_list.h), and every buffer it hands out: the model's launches can then be compared
// with the list the simulator costs, its allocations with core's layer recipe
// (core/layer_recipe.h), and the profiler's launches with the kernels it says it timed.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "core/kernel_list.h"
#include "executor/runtime/cpu_backend.h"
#include "tests/executor/runtime/forwarding_backend.h"

namespace megaplan::test {

class RecordingBackend : public ForwardingBackend {
 public:
  RecordingBackend() : ForwardingBackend(std::make_unique<exec::CpuBackend>()) {}

  // What ran since the last take().
  std::vector<Kernel> take() { return std::exchange(kernels_, {}); }

  // Every MoE router's choice replaced by one that gives expert e exactly routes[e] routes (their sum
  // tokens x k, each at most the tokens), each of probability 1/k: route slots taken route by route
  // (token 0..t-1's first routes, then their second ...), expert after expert, so that no token
  // gets one expert twice.
  void route_by_counts(std::vector<int64_t> routes) { routes_per_expert_ = std::move(routes); }

  // A buffer handed out: its elements, in the compute type (activation) or in fp32.
  struct Allocation {
    bool activation;
    int64_t elements;
    auto operator<=>(const Allocation&) const = default;
  };
  // What was allocated since the last take_allocations(), in order.
  std::vector<Allocation> take_allocations() { return std::exchange(allocations_, {}); }

  float* allocate(std::size_t n) override {
    allocations_.push_back({false, size(n)});
    return ForwardingBackend::allocate(n);
  }
  Activation allocate_activation(std::size_t n) override {
    allocations_.push_back({true, size(n)});
    return ForwardingBackend::allocate_activation(n);
  }

  void refresh_compute_copy(const float* value, std::size_t n, Activation copy) override {
    record(flat_kernel(KernelKind::kRefreshCompute, size(n)));
    ForwardingBackend::refresh_compute_copy(value, n, copy);
  }
  void fill(float* x, std::size_t n, float value) override {
    record(flat_kernel(KernelKind::kFill, size(n)));
    ForwardingBackend::fill(x, n, value);
  }
  void linear_forward(ConstActivation x, ConstActivation w, ConstActivation b, std::size_t m, std::size_t k,
                      std::size_t n, GemmEpilogue epilogue, Activation y, Activation pre) override {
    record(gemm_kernel(GemmLayout::kForward, epilogue, size(m), size(n), size(k)));
    ForwardingBackend::linear_forward(x, w, b, m, k, n, epilogue, y, pre);
  }
  void linear_backward(ConstActivation dy, ConstActivation x, ConstActivation w, std::size_t m, std::size_t k,
                       std::size_t n, Activation dx, float* dw, float* db) override {
    if (dx) record(gemm_kernel(GemmLayout::kInputGradient, GemmEpilogue::kNone, size(m), size(n), size(k)));
    if (dw) {
      record(gemm_kernel(GemmLayout::kWeightGradient, db ? GemmEpilogue::kBiasGradient : GemmEpilogue::kNone, size(m),
                         size(n), size(k)));
    }
    ForwardingBackend::linear_backward(dy, x, w, m, k, n, dx, dw, db);
  }
  void linear_backward_through_gelu(ConstActivation dy, ConstActivation w, std::size_t m, std::size_t k, std::size_t n,
                                    ConstActivation pre, Activation d_pre) override {
    record(gemm_kernel(GemmLayout::kInputGradient, GemmEpilogue::kGeluGradient, size(m), size(n), size(k)));
    ForwardingBackend::linear_backward_through_gelu(dy, w, m, k, n, pre, d_pre);
  }
  void embedding_forward(const int64_t* tokens, std::size_t count, std::size_t seq, ConstActivation word,
                         std::size_t vocab_start, std::size_t vocab_rows, ConstActivation position, std::size_t hidden,
                         Activation y, const TokenPlaces& places) override {
    record(row_kernel(KernelKind::kEmbeddingForward, size(count), size(hidden)));
    ForwardingBackend::embedding_forward(tokens, count, seq, word, vocab_start, vocab_rows, position, hidden, y,
                                         places);
  }
  void embedding_backward(ConstActivation dy, const int64_t* tokens, std::size_t count, std::size_t seq,
                          std::size_t hidden, std::size_t vocab_start, std::size_t vocab_rows, float* dword,
                          float* dposition, const TokenPlaces& places) override {
    record(row_kernel(KernelKind::kEmbeddingBackward, size(count), size(hidden)));
    ForwardingBackend::embedding_backward(dy, tokens, count, seq, hidden, vocab_start, vocab_rows, dword, dposition,
                                          places);
  }
  void layernorm_forward(ConstActivation x, ConstActivation residual, const DropoutMask& residual_dropout,
                         Activation sum_out, ConstActivation gamma, ConstActivation beta, std::size_t rows,
                         std::size_t cols, Activation y, float* mean, float* rstd) override {
    record(row_kernel(KernelKind::kNormForward, size(rows), size(cols), residual != nullptr,
                      residual != nullptr && residual_dropout.active()));
    ForwardingBackend::layernorm_forward(x, residual, residual_dropout, sum_out, gamma, beta, rows, cols, y, mean,
                                         rstd);
  }
  void layernorm_backward(ConstActivation dy, ConstActivation x, ConstActivation gamma, const float* mean,
                          const float* rstd, std::size_t rows, std::size_t cols, ConstActivation residual_grad,
                          Activation dx, float* dgamma, float* dbeta) override {
    record(row_kernel(KernelKind::kNormBackward, size(rows), size(cols), residual_grad != nullptr));
    ForwardingBackend::layernorm_backward(dy, x, gamma, mean, rstd, rows, cols, residual_grad, dx, dgamma, dbeta);
  }
  void rmsnorm_forward(ConstActivation x, ConstActivation residual, const DropoutMask& residual_dropout,
                       Activation sum_out, ConstActivation gamma, std::size_t rows, std::size_t cols, float eps,
                       Activation y, float* rstd) override {
    record(row_kernel(KernelKind::kRmsNormForward, size(rows), size(cols), residual != nullptr,
                      residual != nullptr && residual_dropout.active()));
    ForwardingBackend::rmsnorm_forward(x, residual, residual_dropout, sum_out, gamma, rows, cols, eps, y, rstd);
  }
  void rmsnorm_backward(ConstActivation dy, ConstActivation x, ConstActivation gamma, const float* rstd,
                        std::size_t rows, std::size_t cols, ConstActivation residual_grad, Activation dx,
                        float* dgamma) override {
    record(row_kernel(KernelKind::kRmsNormBackward, size(rows), size(cols), residual_grad != nullptr));
    ForwardingBackend::rmsnorm_backward(dy, x, gamma, rstd, rows, cols, residual_grad, dx, dgamma);
  }
  void head_rmsnorm_forward(ConstActivation qkv, ConstActivation q_gamma, ConstActivation k_gamma, std::size_t tokens,
                            std::size_t groups, std::size_t group, std::size_t dim, float eps, Activation y,
                            float* rstd) override {
    record(
        head_norm_kernel(KernelKind::kHeadRmsNormForward, size(tokens), size(groups * group), size(groups), size(dim)));
    ForwardingBackend::head_rmsnorm_forward(qkv, q_gamma, k_gamma, tokens, groups, group, dim, eps, y, rstd);
  }
  void head_rmsnorm_backward(ConstActivation dy, ConstActivation qkv, ConstActivation q_gamma, ConstActivation k_gamma,
                             const float* rstd, std::size_t tokens, std::size_t groups, std::size_t group,
                             std::size_t dim, Activation dx, float* dq_gamma, float* dk_gamma) override {
    record(head_norm_kernel(KernelKind::kHeadRmsNormBackward, size(tokens), size(groups * group), size(groups),
                            size(dim)));
    ForwardingBackend::head_rmsnorm_backward(dy, qkv, q_gamma, k_gamma, rstd, tokens, groups, group, dim, dx, dq_gamma,
                                             dk_gamma);
  }
  void swiglu_forward(ConstActivation x, std::size_t rows, std::size_t width, Activation y) override {
    record(row_kernel(KernelKind::kSwigluForward, size(rows), size(width)));
    ForwardingBackend::swiglu_forward(x, rows, width, y);
  }
  void swiglu_backward(ConstActivation dy, ConstActivation x, std::size_t rows, std::size_t width,
                       Activation dx) override {
    record(row_kernel(KernelKind::kSwigluBackward, size(rows), size(width)));
    ForwardingBackend::swiglu_backward(dy, x, rows, width, dx);
  }
  void rotary(Activation qkv, std::size_t batch, std::size_t seq, std::size_t groups, std::size_t group,
              std::size_t dim, std::size_t rotary_dim, const RotaryFrequencies& frequencies, bool inverse,
              const TokenPlaces& places) override {
    record(row_kernel(KernelKind::kRotary, size(batch * seq), size(groups * (group + 1) * rotary_dim)));
    ForwardingBackend::rotary(qkv, batch, seq, groups, group, dim, rotary_dim, frequencies, inverse, places);
  }
  void attention_forward(ConstActivation qkv, std::size_t batch, std::size_t seq, std::size_t heads, std::size_t groups,
                         std::size_t dim, const DropoutMask& dropout, Activation out, float* saved) override {
    record(attention_kernel(KernelKind::kAttentionForward, size(batch), size(seq), size(heads), size(dim), size(groups),
                            dropout.active()));
    ForwardingBackend::attention_forward(qkv, batch, seq, heads, groups, dim, dropout, out, saved);
  }
  void attention_backward(ConstActivation dout, ConstActivation qkv, ConstActivation out, const float* saved,
                          std::size_t batch, std::size_t seq, std::size_t heads, std::size_t groups, std::size_t dim,
                          const DropoutMask& dropout, Activation dqkv) override {
    record(attention_kernel(KernelKind::kAttentionBackward, size(batch), size(seq), size(heads), size(dim),
                            size(groups), dropout.active()));
    ForwardingBackend::attention_backward(dout, qkv, out, saved, batch, seq, heads, groups, dim, dropout, dqkv);
  }
  // The ring's calls (core/context_parallel.h): a block is one of the two chunks of dims.seq
  // tokens, on the diagonal where its queries and keys start at the same place.
  void pack_key_values(ConstActivation qkv, const AttentionDims& dims, Activation kv) override {
    record(row_kernel(KernelKind::kPackKeyValues, size(dims.batch * dims.seq), size(2 * dims.groups * dims.dim)));
    ForwardingBackend::pack_key_values(qkv, dims, kv);
  }
  void unpack_key_value_gradients(ConstActivation dkv, const AttentionDims& dims, Activation dqkv) override {
    record(row_kernel(KernelKind::kUnpackKeyValueGradients, size(dims.batch * dims.seq),
                      size(2 * dims.groups * dims.dim)));
    ForwardingBackend::unpack_key_value_gradients(dkv, dims, dqkv);
  }
  void attention_block_forward(ConstActivation qkv, ConstActivation kv, const AttentionDims& dims,
                               const AttentionChunkBlock& block, const DropoutMask& dropout, float* out,
                               float* lse) override {
    record(ring_block(KernelKind::kAttentionBlockForward, dims, block, dropout));
    ForwardingBackend::attention_block_forward(qkv, kv, dims, block, dropout, out, lse);
  }
  void attention_block_backward(ConstActivation dout, ConstActivation qkv, ConstActivation out, const float* lse,
                                ConstActivation kv, const AttentionDims& dims, const AttentionChunkBlock& block,
                                const DropoutMask& dropout, Activation dqkv, Activation dkv) override {
    record(ring_block(KernelKind::kAttentionBlockBackward, dims, block, dropout));
    ForwardingBackend::attention_block_backward(dout, qkv, out, lse, kv, dims, block, dropout, dqkv, dkv);
  }
  void convert(const float* x, std::size_t n, Activation y) override {
    record(flat_kernel(KernelKind::kConvert, size(n)));
    ForwardingBackend::convert(x, n, y);
  }
  void zero(Activation x, std::size_t n) override {
    record(flat_kernel(KernelKind::kZero, size(n)));
    ForwardingBackend::zero(x, n);
  }
  void dropout(ConstActivation x, ConstActivation residual, std::size_t rows, std::size_t cols, const DropoutMask& mask,
               Activation y) override {
    record(row_kernel(KernelKind::kDropout, size(rows), size(cols), residual != nullptr));
    ForwardingBackend::dropout(x, residual, rows, cols, mask, y);
  }
  void cross_entropy_statistics(ConstActivation logits, const int64_t* targets, std::size_t tokens, std::size_t vocab,
                                std::size_t vocab_start, float* lse, float* target_logit, float* peak) override {
    record(row_kernel(KernelKind::kCrossEntropyForward, size(tokens), size(vocab)));
    ForwardingBackend::cross_entropy_statistics(logits, targets, tokens, vocab, vocab_start, lse, target_logit, peak);
  }
  void cross_entropy_shift(const float* peak, std::size_t tokens, float* shard_lse) override {
    record(flat_kernel(KernelKind::kCrossEntropyShift, size(tokens)));
    ForwardingBackend::cross_entropy_shift(peak, tokens, shard_lse);
  }
  void cross_entropy_finish(const float* peak, const float* term_sum, const float* target, const float* mask,
                            std::size_t tokens, float* lse, double* loss_sum) override {
    record(flat_kernel(KernelKind::kCrossEntropyFinish, size(tokens)));
    ForwardingBackend::cross_entropy_finish(peak, term_sum, target, mask, tokens, lse, loss_sum);
  }
  void cross_entropy_backward(ConstActivation logits, const float* lse, const int64_t* targets, const float* mask,
                              std::size_t tokens, std::size_t vocab, std::size_t vocab_start, float scale,
                              Activation dlogits) override {
    record(row_kernel(KernelKind::kCrossEntropyBackward, size(tokens), size(vocab)));
    ForwardingBackend::cross_entropy_backward(logits, lse, targets, mask, tokens, vocab, vocab_start, scale, dlogits);
  }
  void add(ConstActivation a, ConstActivation b, std::size_t n, Activation y) override {
    record(flat_kernel(KernelKind::kAdd, size(n)));
    ForwardingBackend::add(a, b, n, y);
  }
  void copy(ConstActivation from, std::size_t n, Activation to) override {
    record(flat_kernel(KernelKind::kCopy, size(n)));
    ForwardingBackend::copy(from, n, to);
  }
  void moe_top_k(ConstActivation logits, std::size_t tokens, const exec::MoeRouter& router, const float* expert_bias,
                 int32_t* experts, float* probs) override {
    record(moe_call(KernelKind::kMoeTopK, tokens, router.experts, router.topk));
    ForwardingBackend::moe_top_k(logits, tokens, router, expert_bias, experts, probs);
    if (routes_per_expert_.empty()) return;
    std::size_t slot = 0;  // j x tokens + i: token i's route j
    for (std::size_t expert = 0; expert < routes_per_expert_.size(); ++expert) {
      for (int64_t n = 0; n < routes_per_expert_[expert]; ++n, ++slot) {
        const std::size_t route = (slot % tokens) * router.topk + slot / tokens;  // host memory: the CPU backend's
        experts[route] = static_cast<int32_t>(expert);
        probs[route] = 1.0f / static_cast<float>(router.topk);
      }
    }
  }
  void moe_top_k_backward(ConstActivation logits, std::size_t tokens, const exec::MoeRouter& router,
                          const int32_t* experts, const float* d_probs, float* d_logits) override {
    record(moe_call(KernelKind::kMoeTopKBackward, tokens, router.experts, router.topk));
    ForwardingBackend::moe_top_k_backward(logits, tokens, router, experts, d_probs, d_logits);
  }
  std::vector<int64_t> moe_dispatch(const int32_t* experts, const float* probs, std::size_t tokens,
                                    const exec::MoeRouter& router, const exec::MoeCapacity& capacity,
                                    exec::MoeDispatchMaps maps) override {
    record(moe_call(KernelKind::kMoeDispatch, tokens, router.experts, router.topk));
    return ForwardingBackend::moe_dispatch(experts, probs, tokens, router, capacity, maps);
  }
  void moe_permute(ConstActivation x, std::size_t hidden, const int32_t* row_tokens, std::size_t rows,
                   Activation out) override {
    record(row_kernel(KernelKind::kMoePermute, size(rows), size(hidden)));
    ForwardingBackend::moe_permute(x, hidden, row_tokens, rows, out);
  }
  void moe_permute_backward(ConstActivation d_rows, std::size_t hidden, const int32_t* token_rows, std::size_t tokens,
                            std::size_t topk, Activation dx) override {
    record(moe_call(KernelKind::kMoePermuteBackward, tokens, hidden, topk));
    ForwardingBackend::moe_permute_backward(d_rows, hidden, token_rows, tokens, topk, dx);
  }
  void moe_combine(ConstActivation rows, std::size_t hidden, const int32_t* token_rows, const float* probs,
                   std::size_t tokens, std::size_t topk, Activation y) override {
    record(moe_call(KernelKind::kMoeCombine, tokens, hidden, topk));
    ForwardingBackend::moe_combine(rows, hidden, token_rows, probs, tokens, topk, y);
  }
  void moe_combine_backward(ConstActivation dy, ConstActivation rows, std::size_t hidden,
                            exec::ConstMoeDispatchMaps maps, const float* probs, std::size_t tokens, std::size_t topk,
                            std::size_t rows_count, Activation d_rows, float* d_probs) override {
    record(moe_call(KernelKind::kMoeCombineBackward, tokens, hidden, topk, rows_count));
    ForwardingBackend::moe_combine_backward(dy, rows, hidden, maps, probs, tokens, topk, rows_count, d_rows, d_probs);
  }
  void moe_aux_loss_counts(ConstActivation logits, std::size_t tokens, const exec::MoeRouter& router,
                           float* counts) override {
    record(moe_call(KernelKind::kMoeAuxCounts, tokens, router.experts, router.topk));
    ForwardingBackend::moe_aux_loss_counts(logits, tokens, router, counts);
  }
  void moe_switch_loss(ConstActivation logits, std::size_t tokens, const exec::MoeRouter& router, const float* counts,
                       std::size_t total_tokens, double coeff, double* loss_sum, float* d_logits,
                       float gradient_scale) override {
    record(moe_call(d_logits ? KernelKind::kMoeSwitchLossGradient : KernelKind::kMoeSwitchLoss, tokens, router.experts,
                    router.topk));
    ForwardingBackend::moe_switch_loss(logits, tokens, router, counts, total_tokens, coeff, loss_sum, d_logits,
                                       gradient_scale);
  }
  void moe_sequence_aux_loss(ConstActivation logits, std::size_t tokens, std::size_t sequences,
                             const exec::MoeRouter& router, double coeff, double* loss_sum, float* d_logits,
                             float gradient_scale) override {
    record(moe_call(d_logits ? KernelKind::kMoeSequenceAuxLossGradient : KernelKind::kMoeSequenceAuxLoss, tokens,
                    router.experts, router.topk, sequences));
    ForwardingBackend::moe_sequence_aux_loss(logits, tokens, sequences, router, coeff, loss_sum, d_logits,
                                             gradient_scale);
  }
  void moe_z_loss(ConstActivation logits, std::size_t tokens, std::size_t experts, double coeff, double* loss_sum,
                  float* d_logits, float gradient_scale) override {
    record(row_kernel(d_logits ? KernelKind::kMoeZLossGradient : KernelKind::kMoeZLoss, size(tokens), size(experts)));
    ForwardingBackend::moe_z_loss(logits, tokens, experts, coeff, loss_sum, d_logits, gradient_scale);
  }
  void moe_update_expert_bias(const float* counts, std::size_t experts, float rate, float* expert_bias) override {
    record(row_kernel(KernelKind::kMoeUpdateExpertBias, 1, size(experts)));
    ForwardingBackend::moe_update_expert_bias(counts, experts, rate, expert_bias);
  }
  void sigmoid_gated_add(ConstActivation x, ConstActivation gate, std::size_t rows, std::size_t cols,
                         Activation y) override {
    record(row_kernel(KernelKind::kSigmoidGatedAdd, size(rows), size(cols)));
    ForwardingBackend::sigmoid_gated_add(x, gate, rows, cols, y);
  }
  void sigmoid_gated_add_backward(ConstActivation dy, ConstActivation x, ConstActivation gate, std::size_t rows,
                                  std::size_t cols, Activation dx, float* d_gate) override {
    record(row_kernel(KernelKind::kSigmoidGatedAddBackward, size(rows), size(cols)));
    ForwardingBackend::sigmoid_gated_add_backward(dy, x, gate, rows, cols, dx, d_gate);
  }
  double gradient_sum_of_squares(const std::vector<OptimizerTensor>& tensors) override {
    record(flat_kernel(KernelKind::kGradientNorm, elements(tensors)));
    return ForwardingBackend::gradient_sum_of_squares(tensors);
  }
  void adamw_step(const std::vector<OptimizerTensor>& tensors, const AdamwSettings& settings) override {
    record(flat_kernel(KernelKind::kAdamw, elements(tensors)));
    ForwardingBackend::adamw_step(tensors, settings);
  }

 private:
  static int64_t size(std::size_t n) { return static_cast<int64_t>(n); }
  static int64_t elements(const std::vector<OptimizerTensor>& tensors) {
    int64_t total = 0;
    for (const OptimizerTensor& tensor : tensors) total += size(tensor.size);
    return total;
  }
  void record(const Kernel& kernel) { kernels_.push_back(kernel); }
  // core's moe_kernel of a Backend call's sizes.
  static Kernel moe_call(KernelKind kind, std::size_t tokens, std::size_t cols, std::size_t topk, std::size_t m = 0) {
    return moe_kernel(kind, size(tokens), size(cols), size(topk), size(m));
  }
  static Kernel ring_block(KernelKind kind, const AttentionDims& dims, const AttentionChunkBlock& block,
                           const DropoutMask& dropout) {
    return attention_block_kernel(kind, size(dims.batch), size(dims.seq / 2), size(dims.heads), size(dims.dim),
                                  size(dims.groups), dropout.active(), block.query_first == block.key_first);
  }

  std::vector<Kernel> kernels_;
  std::vector<Allocation> allocations_;
  std::vector<int64_t> routes_per_expert_;
};

}  // namespace megaplan::test
