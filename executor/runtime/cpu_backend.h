// The CPU backend: every operation on the reference kernels (executor/kernels/reference), fp32
// with double accumulation; activations are fp32 and weights' compute copies are the master
// weights themselves. Slow but exact enough to train a tiny GPT in the test suite.
#pragma once

#include <chrono>
#include <memory>
#include <unordered_map>
#include <vector>

#include "executor/runtime/backend.h"

namespace megaplan::exec {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  DType activation_type() const override { return DType::kFloat32; }
  int64_t available_bytes() const override;
  float* allocate(std::size_t n) override;
  void release(float* buffer) override;
  Activation allocate_activation(std::size_t n) override;
  void release(Activation buffer) override;
  Activation compute_copy(float* value, std::size_t n) override;
  void release_compute_copy(Activation copy, float* value) override;
  void refresh_compute_copy(const float* value, std::size_t n, Activation copy) override;
  int64_t peak_bytes() const override { return peak_bytes_; }
  void upload(float* device, const float* host, std::size_t n) override;
  void download(float* host, const float* device, std::size_t n) override;
  void upload(Activation device, const float* host, std::size_t n) override;
  void download(float* host, ConstActivation device, std::size_t n) override;
  void fill(float* x, std::size_t n, float value) override;
  void draw_normal(float* x, std::size_t n, const NormalDraws& draws) override;
  void linear_forward(ConstActivation x, ConstActivation w, ConstActivation b, std::size_t m, std::size_t k,
                      std::size_t n, GemmEpilogue epilogue, Activation y, Activation pre_activation) override;
  void linear_backward(ConstActivation dy, ConstActivation x, ConstActivation w, std::size_t m, std::size_t k,
                       std::size_t n, Activation dx, float* dw, float* db) override;
  void linear_backward_through_gelu(ConstActivation dy, ConstActivation w, std::size_t m, std::size_t k, std::size_t n,
                                    ConstActivation pre_activation, Activation d_pre) override;
  void embedding_forward(const int64_t* tokens, std::size_t count, std::size_t seq, ConstActivation word,
                         std::size_t vocab_start, std::size_t vocab_rows, ConstActivation position, std::size_t hidden,
                         Activation y, const TokenPlaces& places) override;
  void embedding_backward(ConstActivation dy, const int64_t* tokens, std::size_t count, std::size_t seq,
                          std::size_t hidden, std::size_t vocab_start, std::size_t vocab_rows, float* dword,
                          float* dposition, const TokenPlaces& places) override;
  void layernorm_forward(ConstActivation x, ConstActivation residual, const DropoutMask& residual_dropout,
                         Activation sum_out, ConstActivation gamma, ConstActivation beta, std::size_t rows,
                         std::size_t cols, Activation y, float* mean, float* rstd) override;
  void layernorm_backward(ConstActivation dy, ConstActivation x, ConstActivation gamma, const float* mean,
                          const float* rstd, std::size_t rows, std::size_t cols, ConstActivation residual_grad,
                          Activation dx, float* dgamma, float* dbeta) override;
  void rmsnorm_forward(ConstActivation x, ConstActivation residual, const DropoutMask& residual_dropout,
                       Activation sum_out, ConstActivation gamma, std::size_t rows, std::size_t cols, float eps,
                       Activation y, float* rstd) override;
  void rmsnorm_backward(ConstActivation dy, ConstActivation x, ConstActivation gamma, const float* rstd,
                        std::size_t rows, std::size_t cols, ConstActivation residual_grad, Activation dx,
                        float* dgamma) override;
  void head_rmsnorm_forward(ConstActivation qkv, ConstActivation q_gamma, ConstActivation k_gamma, std::size_t tokens,
                            std::size_t groups, std::size_t group, std::size_t dim, float eps, Activation y,
                            float* rstd) override;
  void head_rmsnorm_backward(ConstActivation dy, ConstActivation qkv, ConstActivation q_gamma, ConstActivation k_gamma,
                             const float* rstd, std::size_t tokens, std::size_t groups, std::size_t group,
                             std::size_t dim, Activation dx, float* dq_gamma, float* dk_gamma) override;
  void swiglu_forward(ConstActivation x, std::size_t rows, std::size_t width, Activation y) override;
  void swiglu_backward(ConstActivation dy, ConstActivation x, std::size_t rows, std::size_t width,
                       Activation dx) override;
  void rotary(Activation qkv, std::size_t batch, std::size_t seq, std::size_t groups, std::size_t group,
              std::size_t dim, std::size_t rotary_dim, const RotaryFrequencies& frequencies, bool inverse,
              const TokenPlaces& places) override;
  std::size_t attention_saved_size(std::size_t batch, std::size_t seq, std::size_t heads,
                                   std::size_t dim) const override;
  void attention_forward(ConstActivation qkv, std::size_t batch, std::size_t seq, std::size_t heads, std::size_t groups,
                         std::size_t dim, const DropoutMask& dropout, Activation out, float* saved) override;
  void attention_backward(ConstActivation dout, ConstActivation qkv, ConstActivation out, const float* saved,
                          std::size_t batch, std::size_t seq, std::size_t heads, std::size_t groups, std::size_t dim,
                          const DropoutMask& dropout, Activation dqkv) override;
  void pack_key_values(ConstActivation qkv, const AttentionDims& dims, Activation kv) override;
  void unpack_key_value_gradients(ConstActivation dkv, const AttentionDims& dims, Activation dqkv) override;
  void attention_block_forward(ConstActivation qkv, ConstActivation kv, const AttentionDims& dims,
                               const AttentionChunkBlock& block, const DropoutMask& dropout, float* out,
                               float* lse) override;
  void attention_block_backward(ConstActivation dout, ConstActivation qkv, ConstActivation out, const float* lse,
                                ConstActivation kv, const AttentionDims& dims, const AttentionChunkBlock& block,
                                const DropoutMask& dropout, Activation dqkv, Activation dkv) override;
  void convert(const float* x, std::size_t n, Activation y) override;
  void zero(Activation x, std::size_t n) override;
  void dropout(ConstActivation x, ConstActivation residual, std::size_t rows, std::size_t cols, const DropoutMask& mask,
               Activation y) override;
  void cross_entropy_statistics(ConstActivation logits, const int64_t* targets, std::size_t tokens, std::size_t vocab,
                                std::size_t vocab_start, float* lse, float* target_logit, float* peak) override;
  void cross_entropy_shift(const float* peak, std::size_t tokens, float* shard_lse) override;
  void cross_entropy_finish(const float* peak, const float* term_sum, const float* target, const float* weights,
                            std::size_t tokens, float* lse, double* loss_sum) override;
  void cross_entropy_backward(ConstActivation logits, const float* lse, const int64_t* targets, const float* weights,
                              std::size_t tokens, std::size_t vocab, std::size_t vocab_start, float scale,
                              Activation dlogits) override;
  void add(ConstActivation a, ConstActivation b, std::size_t n, Activation y) override;
  void copy(ConstActivation from, std::size_t n, Activation to) override;
  Activation offset(Activation a, std::size_t elements) override;
  // The MoE operations (cpu_backend_moe.cc), on kernels/reference/moe_router.h.
  int32_t* allocate_indices(std::size_t n) override;
  void release(int32_t* buffer) override;
  void moe_top_k(ConstActivation logits, std::size_t tokens, const MoeRouter& router, const float* expert_bias,
                 int32_t* experts, float* probs) override;
  void moe_top_k_backward(ConstActivation logits, std::size_t tokens, const MoeRouter& router, const int32_t* experts,
                          const float* d_probs, float* d_logits) override;
  void moe_count_routes(const int32_t* experts, std::size_t routes, std::size_t expert_count, float* counts) override;
  std::vector<int64_t> moe_dispatch(const int32_t* experts, const float* probs, std::size_t tokens,
                                    const MoeRouter& router, const MoeCapacity& capacity,
                                    MoeDispatchMaps maps) override;
  void moe_permute(ConstActivation x, std::size_t hidden, const int32_t* row_tokens, std::size_t rows,
                   Activation out) override;
  void moe_permute_backward(ConstActivation d_rows, std::size_t hidden, const int32_t* token_rows, std::size_t tokens,
                            std::size_t topk, Activation dx) override;
  void moe_combine(ConstActivation rows, std::size_t hidden, const int32_t* token_rows, const float* probs,
                   std::size_t tokens, std::size_t topk, Activation y) override;
  void moe_combine_backward(ConstActivation dy, ConstActivation rows, std::size_t hidden, ConstMoeDispatchMaps maps,
                            const float* probs, std::size_t tokens, std::size_t topk, std::size_t rows_count,
                            Activation d_rows, float* d_probs) override;
  void moe_aux_loss_counts(ConstActivation logits, std::size_t tokens, const MoeRouter& router, float* counts) override;
  void moe_switch_loss(ConstActivation logits, std::size_t tokens, const MoeRouter& router, const float* counts,
                       std::size_t total_tokens, double coeff, double* loss_sum, float* d_logits,
                       float gradient_scale) override;
  void moe_sequence_aux_loss(ConstActivation logits, std::size_t tokens, std::size_t sequences, const MoeRouter& router,
                             double coeff, double* loss_sum, float* d_logits, float gradient_scale) override;
  void moe_z_loss(ConstActivation logits, std::size_t tokens, std::size_t experts, double coeff, double* loss_sum,
                  float* d_logits, float gradient_scale) override;
  void moe_update_expert_bias(const float* counts, std::size_t experts, float rate, float* expert_bias) override;
  void sigmoid_gated_add(ConstActivation x, ConstActivation gate, std::size_t rows, std::size_t cols,
                         Activation y) override;
  void sigmoid_gated_add_backward(ConstActivation dy, ConstActivation x, ConstActivation gate, std::size_t rows,
                                  std::size_t cols, Activation dx, float* d_gate) override;
  double gradient_sum_of_squares(const std::vector<OptimizerTensor>& tensors) override;
  void adamw_step(const std::vector<OptimizerTensor>& tensors, const AdamwSettings& settings) override;
  void synchronize() override {}
  void* compute_stream() const override { return nullptr; }
  void run_pair(const std::function<void()>& first, const std::function<void()>& second) override {
    first();  // one thread, no streams: nothing to overlap
    second();
  }
  TimingMark mark() override;
  double seconds_between(TimingMark from, TimingMark to) override;
  void release_marks() override { marks_.clear(); }  // keeps the capacity: no allocation once warm

 private:
  struct Buffer {
    std::unique_ptr<float[]> data;
    std::size_t size;
  };
  std::unordered_map<float*, Buffer> buffers_;
  struct IndexBuffer {
    std::unique_ptr<int32_t[]> data;
    std::size_t size;
  };
  std::unordered_map<int32_t*, IndexBuffer> index_buffers_;  // allocate_indices
  int64_t bytes_ = 0;
  int64_t peak_bytes_ = 0;
  std::vector<std::chrono::steady_clock::time_point> marks_;  // by TimingMark::index
};

}  // namespace megaplan::exec
