// The operations a GPT needs, behind one interface so that the same model and runtime code runs on
// plain C++ fp32 (CpuBackend, for tests and tiny models) and on a GPU (the CUDA backend). Buffers
// are float arrays the backend allocates; token ids are host arrays the backend reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace megaplan::exec {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // A zeroed buffer of n floats, owned by the backend until release() or its destruction.
  virtual float* allocate(std::size_t n) = 0;
  virtual void release(float* buffer) = 0;
  // The most bytes allocated at once so far (megaplan's own buffers; for the log's peak memory).
  virtual int64_t peak_bytes() const = 0;
  virtual void upload(float* device, const float* host, std::size_t n) = 0;
  virtual void download(float* host, const float* device, std::size_t n) = 0;
  virtual void fill(float* x, std::size_t n, float value) = 0;

  // y[m x n] = x[m x k] W^T + b, with W stored [n x k] as Megatron stores a linear layer's weight.
  virtual void linear_forward(const float* x, const float* w, const float* b, std::size_t m, std::size_t k,
                              std::size_t n, float* y) = 0;
  // dx[m x k] = dy W (dx may be null); dW += dy^T x; db += column sums of dy (db may be null).
  virtual void linear_backward(const float* dy, const float* x, const float* w, std::size_t m, std::size_t k,
                               std::size_t n, float* dx, float* dw, float* db) = 0;
  // y[tokens x hidden] = word[token] + position[t % seq].
  virtual void embedding_forward(const int64_t* tokens, std::size_t count, std::size_t seq, const float* word,
                                 const float* position, std::size_t hidden, float* y) = 0;
  // dword[token] += dy; dposition[t % seq] += dy.
  virtual void embedding_backward(const float* dy, const int64_t* tokens, std::size_t count, std::size_t seq,
                                  std::size_t hidden, float* dword, float* dposition) = 0;
  virtual void layernorm_forward(const float* x, const float* gamma, const float* beta, std::size_t rows,
                                 std::size_t cols, float* y, float* mean, float* rstd) = 0;
  virtual void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                                  const float* rstd, std::size_t rows, std::size_t cols, float* dx, float* dgamma,
                                  float* dbeta) = 0;
  virtual void gelu_forward(const float* x, std::size_t n, float* y) = 0;
  virtual void gelu_backward(const float* dy, const float* x, std::size_t n, float* dx) = 0;
  // Causal attention on packed qkv [batch x seq x 3 x heads x dim] into out [batch x seq x heads x dim];
  // `saved` holds what the backward needs (attention_saved_size floats).
  virtual std::size_t attention_saved_size(std::size_t batch, std::size_t seq, std::size_t heads,
                                           std::size_t dim) const = 0;
  virtual void attention_forward(const float* qkv, std::size_t batch, std::size_t seq, std::size_t heads,
                                 std::size_t dim, float* out, float* saved) = 0;
  virtual void attention_backward(const float* dout, const float* qkv, const float* saved, std::size_t batch,
                                  std::size_t seq, std::size_t heads, std::size_t dim, float* dqkv) = 0;
  // Masked mean cross entropy; probs [tokens x vocab] keeps the softmax for the backward.
  virtual double cross_entropy_forward(const float* logits, const int64_t* targets, const float* mask,
                                       std::size_t tokens, std::size_t vocab, float* probs) = 0;
  virtual void cross_entropy_backward(const float* probs, const int64_t* targets, const float* mask,
                                      std::size_t tokens, std::size_t vocab, float scale, float* dlogits) = 0;
  virtual void add(const float* a, const float* b, std::size_t n, float* y) = 0;       // y = a + b
  virtual void accumulate(const float* a, std::size_t n, float* y) = 0;                // y += a
  virtual void scale(float* x, std::size_t n, float factor) = 0;                        // x *= factor
  virtual double sum_of_squares(const float* x, std::size_t n) = 0;
  virtual void adamw_step(float* w, const float* g, float* m, float* v, std::size_t n, int64_t step, double lr,
                          double beta1, double beta2, double eps, double weight_decay) = 0;
};

}  // namespace megaplan::exec
