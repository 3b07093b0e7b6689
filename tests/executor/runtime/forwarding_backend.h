// A Backend that passes every call to another: tests derive from it to change one behaviour (a
// failing download, a pair run on one stream) and keep the rest of a real backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "executor/runtime/backend.h"

namespace megaplan::test {

class ForwardingBackend : public exec::Backend {
 public:
  using Activation = exec::Activation;
  using ConstActivation = exec::ConstActivation;
  using OptimizerTensor = exec::OptimizerTensor;
  using AdamwSettings = exec::AdamwSettings;
  using TimingMark = exec::TimingMark;
  using RotaryFrequencies = exec::RotaryFrequencies;
  using DropoutMask = exec::DropoutMask;
  using TokenPlaces = exec::TokenPlaces;
  using AttentionDims = exec::AttentionDims;
  using AttentionChunkBlock = exec::AttentionChunkBlock;

  explicit ForwardingBackend(std::unique_ptr<exec::Backend> inner) : inner_(std::move(inner)) {}

  std::string name() const override { return inner_->name(); }
  DType activation_type() const override { return inner_->activation_type(); }
  int64_t available_bytes() const override { return inner_->available_bytes(); }
  float* allocate(std::size_t n) override { return inner_->allocate(n); }
  void release(float* buffer) override { inner_->release(buffer); }
  Activation allocate_activation(std::size_t n) override { return inner_->allocate_activation(n); }
  void release(Activation buffer) override { inner_->release(buffer); }
  Activation compute_copy(float* value, std::size_t n) override { return inner_->compute_copy(value, n); }
  void release_compute_copy(Activation copy, float* value) override { inner_->release_compute_copy(copy, value); }
  void refresh_compute_copy(const float* value, std::size_t n, Activation copy) override {
    inner_->refresh_compute_copy(value, n, copy);
  }
  int64_t peak_bytes() const override { return inner_->peak_bytes(); }
  void upload(float* device, const float* host, std::size_t n) override { inner_->upload(device, host, n); }
  void download(float* host, const float* device, std::size_t n) override { inner_->download(host, device, n); }
  void upload(Activation device, const float* host, std::size_t n) override { inner_->upload(device, host, n); }
  void download(float* host, ConstActivation device, std::size_t n) override { inner_->download(host, device, n); }
  void fill(float* x, std::size_t n, float value) override { inner_->fill(x, n, value); }
  void draw_normal(float* x, std::size_t n, const exec::NormalDraws& draws) override {
    inner_->draw_normal(x, n, draws);
  }
  void linear_forward(ConstActivation x, ConstActivation w, ConstActivation b, std::size_t m, std::size_t k,
                      std::size_t n, GemmEpilogue epilogue, Activation y, Activation pre) override {
    inner_->linear_forward(x, w, b, m, k, n, epilogue, y, pre);
  }
  void linear_backward(ConstActivation dy, ConstActivation x, ConstActivation w, std::size_t m, std::size_t k,
                       std::size_t n, Activation dx, float* dw, float* db) override {
    inner_->linear_backward(dy, x, w, m, k, n, dx, dw, db);
  }
  void linear_backward_through_gelu(ConstActivation dy, ConstActivation w, std::size_t m, std::size_t k, std::size_t n,
                                    ConstActivation pre, Activation d_pre) override {
    inner_->linear_backward_through_gelu(dy, w, m, k, n, pre, d_pre);
  }
  bool runs_fp16_gemms() const override { return inner_->runs_fp16_gemms(); }
  void set_gemm_precision(megaplan::DType precision) override { inner_->set_gemm_precision(precision); }

  void embedding_forward(const int64_t* tokens, std::size_t count, std::size_t seq, ConstActivation word,
                         std::size_t vocab_start, std::size_t vocab_rows, ConstActivation position, std::size_t hidden,
                         Activation y, const TokenPlaces& places) override {
    inner_->embedding_forward(tokens, count, seq, word, vocab_start, vocab_rows, position, hidden, y, places);
  }
  void embedding_backward(ConstActivation dy, const int64_t* tokens, std::size_t count, std::size_t seq,
                          std::size_t hidden, std::size_t vocab_start, std::size_t vocab_rows, float* dword,
                          float* dposition, const TokenPlaces& places) override {
    inner_->embedding_backward(dy, tokens, count, seq, hidden, vocab_start, vocab_rows, dword, dposition, places);
  }
  void layernorm_forward(ConstActivation x, ConstActivation residual, const DropoutMask& residual_dropout,
                         Activation sum_out, ConstActivation gamma, ConstActivation beta, std::size_t rows,
                         std::size_t cols, Activation y, float* mean, float* rstd) override {
    inner_->layernorm_forward(x, residual, residual_dropout, sum_out, gamma, beta, rows, cols, y, mean, rstd);
  }
  void layernorm_backward(ConstActivation dy, ConstActivation x, ConstActivation gamma, const float* mean,
                          const float* rstd, std::size_t rows, std::size_t cols, ConstActivation residual_grad,
                          Activation dx, float* dgamma, float* dbeta) override {
    inner_->layernorm_backward(dy, x, gamma, mean, rstd, rows, cols, residual_grad, dx, dgamma, dbeta);
  }
  std::size_t attention_saved_size(std::size_t batch, std::size_t seq, std::size_t heads,
                                   std::size_t dim) const override {
    return inner_->attention_saved_size(batch, seq, heads, dim);
  }
  void rmsnorm_forward(ConstActivation x, ConstActivation residual, const DropoutMask& residual_dropout,
                       Activation sum_out, ConstActivation gamma, std::size_t rows, std::size_t cols, float eps,
                       Activation y, float* rstd) override {
    inner_->rmsnorm_forward(x, residual, residual_dropout, sum_out, gamma, rows, cols, eps, y, rstd);
  }
  void rmsnorm_backward(ConstActivation dy, ConstActivation x, ConstActivation gamma, const float* rstd,
                        std::size_t rows, std::size_t cols, ConstActivation residual_grad, Activation dx,
                        float* dgamma) override {
    inner_->rmsnorm_backward(dy, x, gamma, rstd, rows, cols, residual_grad, dx, dgamma);
  }
  void head_rmsnorm_forward(ConstActivation qkv, ConstActivation q_gamma, ConstActivation k_gamma, std::size_t tokens,
                            std::size_t groups, std::size_t group, std::size_t dim, float eps, Activation y,
                            float* rstd) override {
    inner_->head_rmsnorm_forward(qkv, q_gamma, k_gamma, tokens, groups, group, dim, eps, y, rstd);
  }
  void head_rmsnorm_backward(ConstActivation dy, ConstActivation qkv, ConstActivation q_gamma, ConstActivation k_gamma,
                             const float* rstd, std::size_t tokens, std::size_t groups, std::size_t group,
                             std::size_t dim, Activation dx, float* dq_gamma, float* dk_gamma) override {
    inner_->head_rmsnorm_backward(dy, qkv, q_gamma, k_gamma, rstd, tokens, groups, group, dim, dx, dq_gamma, dk_gamma);
  }
  void swiglu_forward(ConstActivation x, std::size_t rows, std::size_t width, Activation y) override {
    inner_->swiglu_forward(x, rows, width, y);
  }
  void swiglu_backward(ConstActivation dy, ConstActivation x, std::size_t rows, std::size_t width,
                       Activation dx) override {
    inner_->swiglu_backward(dy, x, rows, width, dx);
  }
  void rotary(Activation qkv, std::size_t batch, std::size_t seq, std::size_t groups, std::size_t group,
              std::size_t dim, std::size_t rotary_dim, const RotaryFrequencies& frequencies, bool inverse,
              const TokenPlaces& places) override {
    inner_->rotary(qkv, batch, seq, groups, group, dim, rotary_dim, frequencies, inverse, places);
  }
  void attention_forward(ConstActivation qkv, std::size_t batch, std::size_t seq, std::size_t heads, std::size_t groups,
                         std::size_t dim, const DropoutMask& dropout, Activation out, float* saved) override {
    inner_->attention_forward(qkv, batch, seq, heads, groups, dim, dropout, out, saved);
  }
  void attention_backward(ConstActivation dout, ConstActivation qkv, ConstActivation out, const float* saved,
                          std::size_t batch, std::size_t seq, std::size_t heads, std::size_t groups, std::size_t dim,
                          const DropoutMask& dropout, Activation dqkv) override {
    inner_->attention_backward(dout, qkv, out, saved, batch, seq, heads, groups, dim, dropout, dqkv);
  }
  void pack_key_values(ConstActivation qkv, const exec::AttentionDims& dims, Activation kv) override {
    inner_->pack_key_values(qkv, dims, kv);
  }
  void unpack_key_value_gradients(ConstActivation dkv, const exec::AttentionDims& dims, Activation dqkv) override {
    inner_->unpack_key_value_gradients(dkv, dims, dqkv);
  }
  void attention_block_forward(ConstActivation qkv, ConstActivation kv, const exec::AttentionDims& dims,
                               const exec::AttentionChunkBlock& block, const DropoutMask& dropout, float* out,
                               float* lse) override {
    inner_->attention_block_forward(qkv, kv, dims, block, dropout, out, lse);
  }
  void attention_block_backward(ConstActivation dout, ConstActivation qkv, ConstActivation out, const float* lse,
                                ConstActivation kv, const exec::AttentionDims& dims,
                                const exec::AttentionChunkBlock& block, const DropoutMask& dropout, Activation dqkv,
                                Activation dkv) override {
    inner_->attention_block_backward(dout, qkv, out, lse, kv, dims, block, dropout, dqkv, dkv);
  }
  void convert(const float* x, std::size_t n, Activation y) override { inner_->convert(x, n, y); }
  void zero(Activation x, std::size_t n) override { inner_->zero(x, n); }
  void dropout(ConstActivation x, ConstActivation residual, std::size_t rows, std::size_t cols, const DropoutMask& mask,
               Activation y) override {
    inner_->dropout(x, residual, rows, cols, mask, y);
  }
  void cross_entropy_statistics(ConstActivation logits, const int64_t* targets, std::size_t tokens, std::size_t vocab,
                                std::size_t vocab_start, float* lse, float* target_logit, float* peak) override {
    inner_->cross_entropy_statistics(logits, targets, tokens, vocab, vocab_start, lse, target_logit, peak);
  }
  void cross_entropy_shift(const float* peak, std::size_t tokens, float* shard_lse) override {
    inner_->cross_entropy_shift(peak, tokens, shard_lse);
  }
  void cross_entropy_finish(const float* peak, const float* term_sum, const float* target, const float* mask,
                            std::size_t tokens, float* lse, double* loss_sum) override {
    inner_->cross_entropy_finish(peak, term_sum, target, mask, tokens, lse, loss_sum);
  }
  void cross_entropy_backward(ConstActivation logits, const float* lse, const int64_t* targets, const float* mask,
                              std::size_t tokens, std::size_t vocab, std::size_t vocab_start, float scale,
                              Activation dlogits) override {
    inner_->cross_entropy_backward(logits, lse, targets, mask, tokens, vocab, vocab_start, scale, dlogits);
  }
  void add(ConstActivation a, ConstActivation b, std::size_t n, Activation y) override { inner_->add(a, b, n, y); }
  void copy(ConstActivation from, std::size_t n, Activation to) override { inner_->copy(from, n, to); }
  Activation offset(Activation a, std::size_t elements) override { return inner_->offset(a, elements); }
  int32_t* allocate_indices(std::size_t n) override { return inner_->allocate_indices(n); }
  void release(int32_t* buffer) override { inner_->release(buffer); }
  void moe_top_k(ConstActivation logits, std::size_t tokens, const exec::MoeRouter& router, const float* expert_bias,
                 int32_t* experts, float* probs) override {
    inner_->moe_top_k(logits, tokens, router, expert_bias, experts, probs);
  }
  void moe_top_k_backward(ConstActivation logits, std::size_t tokens, const exec::MoeRouter& router,
                          const int32_t* experts, const float* d_probs, float* d_logits) override {
    inner_->moe_top_k_backward(logits, tokens, router, experts, d_probs, d_logits);
  }
  void moe_count_routes(const int32_t* experts, std::size_t routes, std::size_t expert_count, float* counts) override {
    inner_->moe_count_routes(experts, routes, expert_count, counts);
  }
  std::vector<int64_t> moe_dispatch(const int32_t* experts, const float* probs, std::size_t tokens,
                                    const exec::MoeRouter& router, const exec::MoeCapacity& capacity,
                                    exec::MoeDispatchMaps maps) override {
    return inner_->moe_dispatch(experts, probs, tokens, router, capacity, maps);
  }
  void moe_permute(ConstActivation x, std::size_t hidden, const int32_t* row_tokens, std::size_t rows,
                   Activation out) override {
    inner_->moe_permute(x, hidden, row_tokens, rows, out);
  }
  void moe_permute_backward(ConstActivation d_rows, std::size_t hidden, const int32_t* token_rows, std::size_t tokens,
                            std::size_t topk, Activation dx) override {
    inner_->moe_permute_backward(d_rows, hidden, token_rows, tokens, topk, dx);
  }
  void moe_combine(ConstActivation rows, std::size_t hidden, const int32_t* token_rows, const float* probs,
                   std::size_t tokens, std::size_t topk, Activation y) override {
    inner_->moe_combine(rows, hidden, token_rows, probs, tokens, topk, y);
  }
  void moe_combine_backward(ConstActivation dy, ConstActivation rows, std::size_t hidden,
                            exec::ConstMoeDispatchMaps maps, const float* probs, std::size_t tokens, std::size_t topk,
                            std::size_t rows_count, Activation d_rows, float* d_probs) override {
    inner_->moe_combine_backward(dy, rows, hidden, maps, probs, tokens, topk, rows_count, d_rows, d_probs);
  }
  void moe_aux_loss_counts(ConstActivation logits, std::size_t tokens, const exec::MoeRouter& router,
                           float* counts) override {
    inner_->moe_aux_loss_counts(logits, tokens, router, counts);
  }
  void moe_switch_loss(ConstActivation logits, std::size_t tokens, const exec::MoeRouter& router, const float* counts,
                       std::size_t total_tokens, double coeff, double* loss_sum, float* d_logits,
                       float gradient_scale) override {
    inner_->moe_switch_loss(logits, tokens, router, counts, total_tokens, coeff, loss_sum, d_logits, gradient_scale);
  }
  void moe_sequence_aux_loss(ConstActivation logits, std::size_t tokens, std::size_t sequences,
                             const exec::MoeRouter& router, double coeff, double* loss_sum, float* d_logits,
                             float gradient_scale) override {
    inner_->moe_sequence_aux_loss(logits, tokens, sequences, router, coeff, loss_sum, d_logits, gradient_scale);
  }
  void moe_z_loss(ConstActivation logits, std::size_t tokens, std::size_t experts, double coeff, double* loss_sum,
                  float* d_logits, float gradient_scale) override {
    inner_->moe_z_loss(logits, tokens, experts, coeff, loss_sum, d_logits, gradient_scale);
  }
  void moe_update_expert_bias(const float* counts, std::size_t experts, float rate, float* expert_bias) override {
    inner_->moe_update_expert_bias(counts, experts, rate, expert_bias);
  }
  void sigmoid_gated_add(ConstActivation x, ConstActivation gate, std::size_t rows, std::size_t cols,
                         Activation y) override {
    inner_->sigmoid_gated_add(x, gate, rows, cols, y);
  }
  void sigmoid_gated_add_backward(ConstActivation dy, ConstActivation x, ConstActivation gate, std::size_t rows,
                                  std::size_t cols, Activation dx, float* d_gate) override {
    inner_->sigmoid_gated_add_backward(dy, x, gate, rows, cols, dx, d_gate);
  }
  double gradient_sum_of_squares(const std::vector<OptimizerTensor>& tensors) override {
    return inner_->gradient_sum_of_squares(tensors);
  }
  void adamw_step(const std::vector<OptimizerTensor>& tensors, const AdamwSettings& settings) override {
    inner_->adamw_step(tensors, settings);
  }
  void synchronize() override { inner_->synchronize(); }
  void* compute_stream() const override { return inner_->compute_stream(); }
  void run_pair(const std::function<void()>& first, const std::function<void()>& second) override {
    inner_->run_pair(first, second);
  }
  TimingMark mark() override { return inner_->mark(); }
  double seconds_between(TimingMark from, TimingMark to) override { return inner_->seconds_between(from, to); }
  void release_marks() override { inner_->release_marks(); }

 protected:
  exec::Backend& inner() { return *inner_; }

 private:
  std::unique_ptr<exec::Backend> inner_;
};

}  // namespace megaplan::test
