#include "executor/runtime/cpu_backend.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "executor/kernels/reference/adamw.h"
#include "executor/kernels/reference/attention.h"
#include "executor/kernels/reference/cross_entropy.h"
#include "executor/kernels/reference/gelu.h"
#include "executor/kernels/reference/layernorm.h"

namespace megaplan::exec {

namespace {
constexpr float kLayerNormEps = 1e-5f;
}  // namespace

float* CpuBackend::allocate(std::size_t n) {
  auto buffer = std::make_unique<float[]>(std::max<std::size_t>(n, 1));  // value-initialised: zeros
  float* raw = buffer.get();
  buffers_.emplace(raw, Buffer{std::move(buffer), n});
  bytes_ += static_cast<int64_t>(n * sizeof(float));
  peak_bytes_ = std::max(peak_bytes_, bytes_);
  return raw;
}

void CpuBackend::release(float* buffer) {
  const auto found = buffers_.find(buffer);
  if (found == buffers_.end()) return;
  bytes_ -= static_cast<int64_t>(found->second.size * sizeof(float));
  buffers_.erase(found);
}

void CpuBackend::upload(float* device, const float* host, std::size_t n) { std::memcpy(device, host, n * sizeof(float)); }

void CpuBackend::download(float* host, const float* device, std::size_t n) {
  std::memcpy(host, device, n * sizeof(float));
}

void CpuBackend::fill(float* x, std::size_t n, float value) { std::fill(x, x + n, value); }

void CpuBackend::linear_forward(const float* x, const float* w, const float* b, std::size_t m, std::size_t k,
                                std::size_t n, float* y) {
  for (std::size_t i = 0; i < m; ++i) {
    const float* row = x + i * k;
    for (std::size_t j = 0; j < n; ++j) {
      const float* weights = w + j * k;
      float sum = 0;
      for (std::size_t p = 0; p < k; ++p) sum += row[p] * weights[p];
      y[i * n + j] = sum + (b ? b[j] : 0.0f);
    }
  }
}

void CpuBackend::linear_backward(const float* dy, const float* x, const float* w, std::size_t m, std::size_t k,
                                 std::size_t n, float* dx, float* dw, float* db) {
  if (dx) {
    std::fill(dx, dx + m * k, 0.0f);
    for (std::size_t i = 0; i < m; ++i) {
      for (std::size_t j = 0; j < n; ++j) {
        const float g = dy[i * n + j];
        const float* weights = w + j * k;
        float* out = dx + i * k;
        for (std::size_t p = 0; p < k; ++p) out[p] += g * weights[p];
      }
    }
  }
  for (std::size_t i = 0; i < m; ++i) {
    const float* row = x + i * k;
    for (std::size_t j = 0; j < n; ++j) {
      const float g = dy[i * n + j];
      float* out = dw + j * k;
      for (std::size_t p = 0; p < k; ++p) out[p] += g * row[p];
      if (db) db[j] += g;
    }
  }
}

void CpuBackend::embedding_forward(const int64_t* tokens, std::size_t count, std::size_t seq, const float* word,
                                   const float* position, std::size_t hidden, float* y) {
  for (std::size_t t = 0; t < count; ++t) {
    const float* w = word + static_cast<std::size_t>(tokens[t]) * hidden;
    const float* p = position + (t % seq) * hidden;
    for (std::size_t c = 0; c < hidden; ++c) y[t * hidden + c] = w[c] + p[c];
  }
}

void CpuBackend::embedding_backward(const float* dy, const int64_t* tokens, std::size_t count, std::size_t seq,
                                    std::size_t hidden, float* dword, float* dposition) {
  for (std::size_t t = 0; t < count; ++t) {
    float* w = dword + static_cast<std::size_t>(tokens[t]) * hidden;
    float* p = dposition + (t % seq) * hidden;
    for (std::size_t c = 0; c < hidden; ++c) {
      w[c] += dy[t * hidden + c];
      p[c] += dy[t * hidden + c];
    }
  }
}

void CpuBackend::layernorm_forward(const float* x, const float* gamma, const float* beta, std::size_t rows,
                                   std::size_t cols, float* y, float* mean, float* rstd) {
  reference::layernorm_forward(x, gamma, beta, rows, cols, kLayerNormEps, y, mean, rstd);
}

void CpuBackend::layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                                    const float* rstd, std::size_t rows, std::size_t cols, float* dx, float* dgamma,
                                    float* dbeta) {
  reference::layernorm_backward(dy, x, gamma, mean, rstd, rows, cols, dx, dgamma, dbeta);
}

void CpuBackend::gelu_forward(const float* x, std::size_t n, float* y) { reference::gelu_forward(x, n, y); }

void CpuBackend::gelu_backward(const float* dy, const float* x, std::size_t n, float* dx) {
  reference::gelu_backward(dy, x, n, dx);
}

std::size_t CpuBackend::attention_saved_size(std::size_t batch, std::size_t seq, std::size_t heads,
                                             std::size_t) const {
  return batch * heads * seq * seq;  // the probabilities
}

namespace {

// Copies head h of batch row b out of packed qkv into contiguous [seq x dim] q, k and v.
void gather_head(const float* qkv, std::size_t b, std::size_t h, std::size_t seq, std::size_t heads, std::size_t dim,
                 std::vector<float>& q, std::vector<float>& k, std::vector<float>& v) {
  for (std::size_t s = 0; s < seq; ++s) {
    const float* row = qkv + ((b * seq + s) * heads + h) * 3 * dim;
    const auto at = static_cast<std::ptrdiff_t>(s * dim);
    std::copy(row, row + dim, q.begin() + at);
    std::copy(row + dim, row + 2 * dim, k.begin() + at);
    std::copy(row + 2 * dim, row + 3 * dim, v.begin() + at);
  }
}

}  // namespace

// qkv rows hold, per head, its q, k and v (Megatron's per-head grouping, which tensor parallelism
// splits by heads): element (b, s, head, part, d) at ((b * seq + s) * heads + head) * 3 * dim + part * dim + d.
void CpuBackend::attention_forward(const float* qkv, std::size_t batch, std::size_t seq, std::size_t heads,
                                   std::size_t dim, float* out, float* saved) {
  std::vector<float> q(seq * dim), k(seq * dim), v(seq * dim), o(seq * dim);
  for (std::size_t b = 0; b < batch; ++b) {
    for (std::size_t h = 0; h < heads; ++h) {
      gather_head(qkv, b, h, seq, heads, dim, q, k, v);
      reference::attention_forward(q.data(), k.data(), v.data(), 1, seq, dim, o.data(),
                                   saved + (b * heads + h) * seq * seq);
      for (std::size_t s = 0; s < seq; ++s) {
        std::copy(o.begin() + static_cast<std::ptrdiff_t>(s * dim), o.begin() + static_cast<std::ptrdiff_t>((s + 1) * dim),
                  out + ((b * seq + s) * heads + h) * dim);
      }
    }
  }
}

void CpuBackend::attention_backward(const float* dout, const float* qkv, const float* saved, std::size_t batch,
                                    std::size_t seq, std::size_t heads, std::size_t dim, float* dqkv) {
  std::vector<float> q(seq * dim), k(seq * dim), v(seq * dim), g(seq * dim), dq(seq * dim), dk(seq * dim),
      dv(seq * dim);
  for (std::size_t b = 0; b < batch; ++b) {
    for (std::size_t h = 0; h < heads; ++h) {
      gather_head(qkv, b, h, seq, heads, dim, q, k, v);
      for (std::size_t s = 0; s < seq; ++s) {
        const float* grad = dout + ((b * seq + s) * heads + h) * dim;
        std::copy(grad, grad + dim, g.begin() + static_cast<std::ptrdiff_t>(s * dim));
      }
      reference::attention_backward(g.data(), q.data(), k.data(), v.data(), saved + (b * heads + h) * seq * seq, 1,
                                    seq, dim, dq.data(), dk.data(), dv.data());
      for (std::size_t s = 0; s < seq; ++s) {
        float* row = dqkv + ((b * seq + s) * heads + h) * 3 * dim;
        const auto at = static_cast<std::ptrdiff_t>(s * dim);
        std::copy(dq.begin() + at, dq.begin() + at + static_cast<std::ptrdiff_t>(dim), row);
        std::copy(dk.begin() + at, dk.begin() + at + static_cast<std::ptrdiff_t>(dim), row + dim);
        std::copy(dv.begin() + at, dv.begin() + at + static_cast<std::ptrdiff_t>(dim), row + 2 * dim);
      }
    }
  }
}

double CpuBackend::cross_entropy_forward(const float* logits, const int64_t* targets, const float* mask,
                                         std::size_t tokens, std::size_t vocab, float* probs) {
  std::vector<float> losses(tokens);
  return reference::cross_entropy_forward(logits, targets, mask, tokens, vocab, losses.data(), probs);
}

void CpuBackend::cross_entropy_backward(const float* probs, const int64_t* targets, const float* mask,
                                        std::size_t tokens, std::size_t vocab, float scale, float* dlogits) {
  reference::cross_entropy_backward(probs, targets, mask, tokens, vocab, scale, dlogits);
}

void CpuBackend::add(const float* a, const float* b, std::size_t n, float* y) {
  for (std::size_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void CpuBackend::accumulate(const float* a, std::size_t n, float* y) {
  for (std::size_t i = 0; i < n; ++i) y[i] += a[i];
}

void CpuBackend::scale(float* x, std::size_t n, float factor) {
  for (std::size_t i = 0; i < n; ++i) x[i] *= factor;
}

double CpuBackend::sum_of_squares(const float* x, std::size_t n) {
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

void CpuBackend::adamw_step(float* w, const float* g, float* m, float* v, std::size_t n, int64_t step, double lr,
                            double beta1, double beta2, double eps, double weight_decay) {
  reference::adamw_step(w, g, m, v, n, step, {lr, beta1, beta2, eps, weight_decay});
}

}  // namespace megaplan::exec
