// The CPU backend: every operation on the reference kernels (executor/kernels/reference), fp32
// with double accumulation. Slow but exact enough to train a tiny GPT in the test suite.
#pragma once

#include <memory>
#include <unordered_map>

#include "executor/runtime/backend.h"

namespace megaplan::exec {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  float* allocate(std::size_t n) override;
  void release(float* buffer) override;
  int64_t peak_bytes() const override { return peak_bytes_; }
  void upload(float* device, const float* host, std::size_t n) override;
  void download(float* host, const float* device, std::size_t n) override;
  void fill(float* x, std::size_t n, float value) override;
  void linear_forward(const float* x, const float* w, const float* b, std::size_t m, std::size_t k, std::size_t n,
                      float* y) override;
  void linear_backward(const float* dy, const float* x, const float* w, std::size_t m, std::size_t k, std::size_t n,
                       float* dx, float* dw, float* db) override;
  void embedding_forward(const int64_t* tokens, std::size_t count, std::size_t seq, const float* word,
                         const float* position, std::size_t hidden, float* y) override;
  void embedding_backward(const float* dy, const int64_t* tokens, std::size_t count, std::size_t seq,
                          std::size_t hidden, float* dword, float* dposition) override;
  void layernorm_forward(const float* x, const float* gamma, const float* beta, std::size_t rows, std::size_t cols,
                         float* y, float* mean, float* rstd) override;
  void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean, const float* rstd,
                          std::size_t rows, std::size_t cols, float* dx, float* dgamma, float* dbeta) override;
  void gelu_forward(const float* x, std::size_t n, float* y) override;
  void gelu_backward(const float* dy, const float* x, std::size_t n, float* dx) override;
  std::size_t attention_saved_size(std::size_t batch, std::size_t seq, std::size_t heads,
                                   std::size_t dim) const override;
  void attention_forward(const float* qkv, std::size_t batch, std::size_t seq, std::size_t heads, std::size_t dim,
                         float* out, float* saved) override;
  void attention_backward(const float* dout, const float* qkv, const float* saved, std::size_t batch, std::size_t seq,
                          std::size_t heads, std::size_t dim, float* dqkv) override;
  double cross_entropy_forward(const float* logits, const int64_t* targets, const float* mask, std::size_t tokens,
                               std::size_t vocab, float* probs) override;
  void cross_entropy_backward(const float* probs, const int64_t* targets, const float* mask, std::size_t tokens,
                              std::size_t vocab, float scale, float* dlogits) override;
  void add(const float* a, const float* b, std::size_t n, float* y) override;
  void accumulate(const float* a, std::size_t n, float* y) override;
  void scale(float* x, std::size_t n, float factor) override;
  double sum_of_squares(const float* x, std::size_t n) override;
  void adamw_step(float* w, const float* g, float* m, float* v, std::size_t n, int64_t step, double lr, double beta1,
                  double beta2, double eps, double weight_decay) override;

 private:
  struct Buffer {
    std::unique_ptr<float[]> data;
    std::size_t size;
  };
  std::unordered_map<float*, Buffer> buffers_;
  int64_t bytes_ = 0;
  int64_t peak_bytes_ = 0;
};

}  // namespace megaplan::exec
