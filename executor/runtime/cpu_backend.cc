#include "executor/runtime/cpu_backend.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "executor/kernels/reference/adamw.h"
#include "executor/kernels/reference/attention.h"
#include "executor/kernels/reference/attention_block.h"
#include "executor/kernels/reference/cross_entropy.h"
#include "executor/kernels/reference/dropout.h"
#include "executor/kernels/reference/embedding.h"
#include "executor/kernels/reference/gelu.h"
#include "executor/kernels/reference/layernorm.h"
#include "executor/kernels/reference/rmsnorm.h"
#include "executor/kernels/reference/rope.h"
#include "executor/kernels/reference/swiglu.h"
#include "executor/runtime/host_memory.h"

namespace megaplan::exec {

namespace {
constexpr float kLayerNormEps = 1e-5f;

// Activations are fp32 here.
float* f(Activation a) { return reinterpret_cast<float*>(a); }
const float* f(ConstActivation a) { return reinterpret_cast<const float*>(a); }

void add_floats(const float* a, const float* b, std::size_t n, float* y) {
  for (std::size_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

// A norm's input: x, or with the residual stream's add fused, x + dropout(residual) written to sum_out.
const float* norm_input(ConstActivation x, ConstActivation residual, const DropoutMask& residual_dropout,
                        Activation sum_out, std::size_t rows, std::size_t cols) {
  if (!residual) return f(x);
  reference::dropout(f(residual), f(x), rows, cols, residual_dropout, f(sum_out));
  return f(sum_out);
}

// A norm's backward, `through_norm(out)` writing its dx, into dx plus the residual stream's
// gradient where there is one (through a scratch block then: residual_grad may be dx itself).
template <typename Backward>
void norm_backward_into(Backward through_norm, ConstActivation residual_grad, Activation dx, std::size_t n) {
  if (!residual_grad) {
    through_norm(f(dx));
    return;
  }
  std::vector<float> scratch(n);
  through_norm(scratch.data());
  for (std::size_t i = 0; i < n; ++i) f(dx)[i] = scratch[i] + f(residual_grad)[i];
}
}  // namespace

int64_t CpuBackend::available_bytes() const { return host_available_bytes(); }

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

Activation CpuBackend::allocate_activation(std::size_t n) { return reinterpret_cast<Activation>(allocate(n)); }

void CpuBackend::release(Activation buffer) { release(f(buffer)); }

Activation CpuBackend::compute_copy(float* value, std::size_t) { return reinterpret_cast<Activation>(value); }

void CpuBackend::release_compute_copy(Activation, float*) {}  // the master weight itself

void CpuBackend::refresh_compute_copy(const float*, std::size_t, Activation) {}

void CpuBackend::upload(float* device, const float* host, std::size_t n) {
  std::memcpy(device, host, n * sizeof(float));
}

void CpuBackend::download(float* host, const float* device, std::size_t n) {
  std::memcpy(host, device, n * sizeof(float));
}

void CpuBackend::upload(Activation device, const float* host, std::size_t n) { upload(f(device), host, n); }

void CpuBackend::download(float* host, ConstActivation device, std::size_t n) { download(host, f(device), n); }

void CpuBackend::fill(float* x, std::size_t n, float value) { std::fill(x, x + n, value); }

void CpuBackend::draw_normal(float* x, std::size_t n, const NormalDraws& draws) {
  for (std::size_t i = 0; 2 * i < n; ++i) draws.draw_two(i, n, x);
}

void CpuBackend::linear_forward(ConstActivation x_in, ConstActivation w_in, ConstActivation b_in, std::size_t m,
                                std::size_t k, std::size_t n, GemmEpilogue epilogue, Activation y_out,
                                Activation pre_activation) {
  if (!is_forward_epilogue(epilogue)) {
    throw std::logic_error("linear_forward: " + to_string(epilogue) + " is not a forward epilogue");
  }
  const float *x = f(x_in), *w = f(w_in), *b = epilogue == GemmEpilogue::kNone ? nullptr : f(b_in);
  float* y = epilogue == GemmEpilogue::kBiasGelu ? f(pre_activation) : f(y_out);
  for (std::size_t i = 0; i < m; ++i) {
    const float* row = x + i * k;
    for (std::size_t j = 0; j < n; ++j) {
      const float* weights = w + j * k;
      float sum = 0;
      for (std::size_t p = 0; p < k; ++p) sum += row[p] * weights[p];
      y[i * n + j] = sum + (b ? b[j] : 0.0f);
    }
  }
  if (epilogue == GemmEpilogue::kBiasGelu) reference::gelu_forward(y, m * n, f(y_out));
}

void CpuBackend::linear_backward(ConstActivation dy_in, ConstActivation x_in, ConstActivation w_in, std::size_t m,
                                 std::size_t k, std::size_t n, Activation dx_out, float* dw, float* db) {
  const float *dy = f(dy_in), *x = f(x_in), *w = f(w_in);
  if (float* dx = f(dx_out)) {
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
  if (!dw) return;
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

void CpuBackend::linear_backward_through_gelu(ConstActivation dy, ConstActivation w, std::size_t m, std::size_t k,
                                              std::size_t n, ConstActivation pre_activation, Activation d_pre) {
  std::vector<float> d_gelu(m * k);
  linear_backward(dy, nullptr, w, m, k, n, reinterpret_cast<Activation>(d_gelu.data()), nullptr, nullptr);
  reference::gelu_backward(d_gelu.data(), f(pre_activation), m * k, f(d_pre));
}

void CpuBackend::embedding_forward(const int64_t* tokens, std::size_t count, std::size_t seq, ConstActivation word,
                                   std::size_t vocab_start, std::size_t vocab_rows, ConstActivation position,
                                   std::size_t hidden, Activation y, const TokenPlaces& places) {
  reference::embedding_forward(tokens, count, seq, f(word), vocab_start, vocab_rows, f(position), hidden, f(y), places);
}

void CpuBackend::embedding_backward(ConstActivation dy, const int64_t* tokens, std::size_t count, std::size_t seq,
                                    std::size_t hidden, std::size_t vocab_start, std::size_t vocab_rows, float* dword,
                                    float* dposition, const TokenPlaces& places) {
  reference::embedding_backward(f(dy), tokens, count, seq, hidden, vocab_start, vocab_rows, dword, dposition, places);
}

void CpuBackend::layernorm_forward(ConstActivation x, ConstActivation residual, const DropoutMask& residual_dropout,
                                   Activation sum_out, ConstActivation gamma, ConstActivation beta, std::size_t rows,
                                   std::size_t cols, Activation y, float* mean, float* rstd) {
  reference::layernorm_forward(norm_input(x, residual, residual_dropout, sum_out, rows, cols), f(gamma), f(beta), rows,
                               cols, kLayerNormEps, f(y), mean, rstd);
}

void CpuBackend::layernorm_backward(ConstActivation dy, ConstActivation x, ConstActivation gamma, const float* mean,
                                    const float* rstd, std::size_t rows, std::size_t cols,
                                    ConstActivation residual_grad, Activation dx, float* dgamma, float* dbeta) {
  norm_backward_into(
      [&](float* out) {
        reference::layernorm_backward(f(dy), f(x), f(gamma), mean, rstd, rows, cols, out, dgamma, dbeta);
      },
      residual_grad, dx, rows * cols);
}

void CpuBackend::rmsnorm_forward(ConstActivation x, ConstActivation residual, const DropoutMask& residual_dropout,
                                 Activation sum_out, ConstActivation gamma, std::size_t rows, std::size_t cols,
                                 float eps, Activation y, float* rstd) {
  reference::rmsnorm_forward(norm_input(x, residual, residual_dropout, sum_out, rows, cols), f(gamma), rows, cols, eps,
                             f(y), rstd);
}

void CpuBackend::rmsnorm_backward(ConstActivation dy, ConstActivation x, ConstActivation gamma, const float* rstd,
                                  std::size_t rows, std::size_t cols, ConstActivation residual_grad, Activation dx,
                                  float* dgamma) {
  norm_backward_into(
      [&](float* out) { reference::rmsnorm_backward(f(dy), f(x), f(gamma), rstd, rows, cols, out, dgamma); },
      residual_grad, dx, rows * cols);
}

void CpuBackend::head_rmsnorm_forward(ConstActivation qkv, ConstActivation q_gamma, ConstActivation k_gamma,
                                      std::size_t tokens, std::size_t groups, std::size_t group, std::size_t dim,
                                      float eps, Activation y, float* rstd) {
  reference::head_rmsnorm_forward(f(qkv), f(q_gamma), f(k_gamma), tokens, groups, group, dim, eps, f(y), rstd);
}

void CpuBackend::head_rmsnorm_backward(ConstActivation dy, ConstActivation qkv, ConstActivation q_gamma,
                                       ConstActivation k_gamma, const float* rstd, std::size_t tokens,
                                       std::size_t groups, std::size_t group, std::size_t dim, Activation dx,
                                       float* dq_gamma, float* dk_gamma) {
  reference::head_rmsnorm_backward(f(dy), f(qkv), f(q_gamma), f(k_gamma), rstd, tokens, groups, group, dim, f(dx),
                                   dq_gamma, dk_gamma);
}

void CpuBackend::swiglu_forward(ConstActivation x, std::size_t rows, std::size_t width, Activation y) {
  reference::swiglu_forward(f(x), rows, width, f(y));
}

void CpuBackend::swiglu_backward(ConstActivation dy, ConstActivation x, std::size_t rows, std::size_t width,
                                 Activation dx) {
  reference::swiglu_backward(f(dy), f(x), rows, width, f(dx));
}

void CpuBackend::rotary(Activation qkv, std::size_t batch, std::size_t seq, std::size_t groups, std::size_t group,
                        std::size_t dim, std::size_t rotary_dim, const RotaryFrequencies& frequencies, bool inverse,
                        const TokenPlaces& places) {
  // Each group's query heads and key head are adjacent: group + 1 heads from the group's start.
  const std::size_t group_stride = (group + 2) * dim;
  for (std::size_t g = 0; g < groups; ++g) {
    reference::rope_apply(f(qkv) + g * group_stride, batch, seq, group + 1, dim, groups * group_stride, rotary_dim,
                          frequencies, inverse, places);
  }
}

std::size_t CpuBackend::attention_saved_size(std::size_t batch, std::size_t seq, std::size_t heads, std::size_t) const {
  return batch * heads * seq * seq;  // the probabilities
}

namespace {

// Where query head h's q of token (b, s) starts in a fused qkv [batch, seq, groups, group + 2, dim];
// its group's k and v follow the group's queries.
struct QkvLayout {
  std::size_t seq, heads, groups, dim;
  std::size_t group() const { return heads / groups; }
  std::size_t token_stride() const { return groups * (group() + 2) * dim; }
  std::size_t query(std::size_t b, std::size_t s, std::size_t h) const {
    return (b * seq + s) * token_stride() + (h / group()) * (group() + 2) * dim + (h % group()) * dim;
  }
  std::size_t key(std::size_t b, std::size_t s, std::size_t h) const {
    return (b * seq + s) * token_stride() + (h / group()) * (group() + 2) * dim + group() * dim;
  }
  std::size_t value(std::size_t b, std::size_t s, std::size_t h) const { return key(b, s, h) + dim; }
};

// Copies query head h of batch row b, and its group's key and value, into contiguous [seq x dim] blocks.
void gather_head(const float* qkv, const QkvLayout& layout, std::size_t b, std::size_t h, std::vector<float>& q,
                 std::vector<float>& k, std::vector<float>& v) {
  const std::size_t dim = layout.dim;
  for (std::size_t s = 0; s < layout.seq; ++s) {
    const auto at = static_cast<std::ptrdiff_t>(s * dim);
    std::copy_n(qkv + layout.query(b, s, h), dim, q.begin() + at);
    std::copy_n(qkv + layout.key(b, s, h), dim, k.begin() + at);
    std::copy_n(qkv + layout.value(b, s, h), dim, v.begin() + at);
  }
}

}  // namespace

void CpuBackend::attention_forward(ConstActivation qkv_in, std::size_t batch, std::size_t seq, std::size_t heads,
                                   std::size_t groups, std::size_t dim, const DropoutMask& dropout, Activation out_,
                                   float* saved) {
  const float* qkv = f(qkv_in);
  float* out = f(out_);
  const QkvLayout layout{seq, heads, groups, dim};
  std::vector<float> q(seq * dim), k(seq * dim), v(seq * dim), o(seq * dim);
  for (std::size_t b = 0; b < batch; ++b) {
    for (std::size_t h = 0; h < heads; ++h) {
      gather_head(qkv, layout, b, h, q, k, v);
      reference::attention_forward(q.data(), k.data(), v.data(), 1, seq, dim, dropout, b, h, o.data(),
                                   saved + (b * heads + h) * seq * seq);
      for (std::size_t s = 0; s < seq; ++s) {
        std::copy_n(o.begin() + static_cast<std::ptrdiff_t>(s * dim), dim, out + ((b * seq + s) * heads + h) * dim);
      }
    }
  }
}

void CpuBackend::attention_backward(ConstActivation dout_in, ConstActivation qkv_in, ConstActivation,
                                    const float* saved, std::size_t batch, std::size_t seq, std::size_t heads,
                                    std::size_t groups, std::size_t dim, const DropoutMask& dropout,
                                    Activation dqkv_out) {
  const float *dout = f(dout_in), *qkv = f(qkv_in);
  float* dqkv = f(dqkv_out);
  const QkvLayout layout{seq, heads, groups, dim};
  std::fill_n(dqkv, batch * seq * layout.token_stride(), 0.0f);  // a group's dk and dv sum over its queries
  std::vector<float> q(seq * dim), k(seq * dim), v(seq * dim), g(seq * dim), dq(seq * dim), dk(seq * dim),
      dv(seq * dim);
  for (std::size_t b = 0; b < batch; ++b) {
    for (std::size_t h = 0; h < heads; ++h) {
      gather_head(qkv, layout, b, h, q, k, v);
      for (std::size_t s = 0; s < seq; ++s) {
        std::copy_n(dout + ((b * seq + s) * heads + h) * dim, dim, g.begin() + static_cast<std::ptrdiff_t>(s * dim));
      }
      reference::attention_backward(g.data(), q.data(), k.data(), v.data(), saved + (b * heads + h) * seq * seq, 1, seq,
                                    dim, dropout, b, h, dq.data(), dk.data(), dv.data());
      for (std::size_t s = 0; s < seq; ++s) {
        const std::size_t at = s * dim;
        float* dq_row = dqkv + layout.query(b, s, h);
        float* dk_row = dqkv + layout.key(b, s, h);
        float* dv_row = dqkv + layout.value(b, s, h);
        for (std::size_t d = 0; d < dim; ++d) {
          dq_row[d] = dq[at + d];
          dk_row[d] += dk[at + d];
          dv_row[d] += dv[at + d];
        }
      }
    }
  }
}

namespace {

// Where group g's key of token (b, s) starts in a packed kv [batch, seq, groups, 2, dim]; its value follows.
std::size_t packed_key(const AttentionDims& dims, std::size_t b, std::size_t s, std::size_t g) {
  return ((b * dims.seq + s) * dims.groups + g) * 2 * dims.dim;
}

// One head's rows of a block: the query chunk's queries (and their rows of a [batch, seq, heads,
// dim] tensor), the key chunk's keys and values, each [chunk x dim].
struct BlockRows {
  const AttentionDims& dims;
  const AttentionChunkBlock& block;
  std::size_t chunk() const { return dims.seq / 2; }
  std::size_t query_token(std::size_t i) const { return block.query_chunk * chunk() + i; }
  std::size_t key_token(std::size_t j) const { return block.key_chunk * chunk() + j; }
  std::size_t head_row(std::size_t b, std::size_t i, std::size_t h) const {
    return ((b * dims.seq + query_token(i)) * dims.heads + h) * dims.dim;
  }
  reference::BlockPlaces places() const {
    return {static_cast<std::size_t>(block.query_first), static_cast<std::size_t>(block.key_first)};
  }
  // Query head h of sequence b's queries in the query chunk, and its group's keys and values in
  // the key chunk, into contiguous [chunk x dim] blocks.
  void gather(const float* qkv, const float* kv, std::size_t b, std::size_t h, float* q, float* k, float* v) const {
    const QkvLayout layout{dims.seq, dims.heads, dims.groups, dims.dim};
    const std::size_t dim = dims.dim, group = h / layout.group();
    for (std::size_t i = 0; i < chunk(); ++i) {
      std::copy_n(qkv + layout.query(b, query_token(i), h), dim, q + i * dim);
      const float* key = kv + packed_key(dims, b, key_token(i), group);
      std::copy_n(key, dim, k + i * dim);
      std::copy_n(key + dim, dim, v + i * dim);
    }
  }
};

// Between a fused qkv and a packed kv (Backend::pack_key_values): kv = qkv's keys and values, or
// (unpack) qkv's keys and values = kv's.
void copy_key_values(const float* from, float* to, const AttentionDims& dims, bool unpack) {
  const QkvLayout layout{dims.seq, dims.heads, dims.groups, dims.dim};
  for (std::size_t b = 0; b < dims.batch; ++b) {
    for (std::size_t s = 0; s < dims.seq; ++s) {
      for (std::size_t g = 0; g < dims.groups; ++g) {
        const std::size_t fused = layout.key(b, s, g * layout.group()), packed = packed_key(dims, b, s, g);
        std::copy_n(from + (unpack ? packed : fused), 2 * dims.dim, to + (unpack ? fused : packed));
      }
    }
  }
}

}  // namespace

void CpuBackend::pack_key_values(ConstActivation qkv, const AttentionDims& dims, Activation kv) {
  copy_key_values(f(qkv), f(kv), dims, false);
}

void CpuBackend::unpack_key_value_gradients(ConstActivation dkv, const AttentionDims& dims, Activation dqkv) {
  copy_key_values(f(dkv), f(dqkv), dims, true);
}

void CpuBackend::attention_block_forward(ConstActivation qkv_in, ConstActivation kv_in, const AttentionDims& dims,
                                         const AttentionChunkBlock& block, const DropoutMask& dropout, float* out,
                                         float* lse) {
  const float *qkv = f(qkv_in), *kv = f(kv_in);
  const BlockRows rows{dims, block};
  const std::size_t chunk = rows.chunk(), dim = dims.dim;
  std::vector<float> q(chunk * dim), k(chunk * dim), v(chunk * dim), o(chunk * dim), block_lse(chunk),
      running(chunk * dim);
  for (std::size_t b = 0; b < dims.batch; ++b) {
    for (std::size_t h = 0; h < dims.heads; ++h) {
      rows.gather(qkv, kv, b, h, q.data(), k.data(), v.data());
      for (std::size_t i = 0; i < chunk; ++i) {
        std::copy_n(out + rows.head_row(b, i, h), dim, running.data() + i * dim);
      }
      reference::attention_block_forward(q.data(), k.data(), v.data(), 1, chunk, chunk, dim, rows.places(), dropout, b,
                                         h, o.data(), block_lse.data());
      float* row_lse = lse + (b * dims.heads + h) * dims.seq + block.query_chunk * chunk;
      reference::merge_attention_block(running.data(), row_lse, o.data(), block_lse.data(), 1, chunk, dim);
      for (std::size_t i = 0; i < chunk; ++i) std::copy_n(running.data() + i * dim, dim, out + rows.head_row(b, i, h));
    }
  }
}

void CpuBackend::attention_block_backward(ConstActivation dout_in, ConstActivation qkv_in, ConstActivation out_in,
                                          const float* lse, ConstActivation kv_in, const AttentionDims& dims,
                                          const AttentionChunkBlock& block, const DropoutMask& dropout,
                                          Activation dqkv_out, Activation dkv_out) {
  const float *dout = f(dout_in), *qkv = f(qkv_in), *out = f(out_in), *kv = f(kv_in);
  float *dqkv = f(dqkv_out), *dkv = f(dkv_out);
  const QkvLayout layout{dims.seq, dims.heads, dims.groups, dims.dim};
  const BlockRows rows{dims, block};
  const std::size_t chunk = rows.chunk(), dim = dims.dim;
  std::vector<float> q(chunk * dim), k(chunk * dim), v(chunk * dim), o(chunk * dim), g(chunk * dim), dq(chunk * dim),
      dk(chunk * dim), dv(chunk * dim);
  for (std::size_t b = 0; b < dims.batch; ++b) {
    for (std::size_t h = 0; h < dims.heads; ++h) {
      const std::size_t group = h / layout.group();
      rows.gather(qkv, kv, b, h, q.data(), k.data(), v.data());
      for (std::size_t i = 0; i < chunk; ++i) {
        std::copy_n(out + rows.head_row(b, i, h), dim, o.data() + i * dim);
        std::copy_n(dout + rows.head_row(b, i, h), dim, g.data() + i * dim);
      }
      std::fill(dq.begin(), dq.end(), 0.0f);
      std::fill(dk.begin(), dk.end(), 0.0f);
      std::fill(dv.begin(), dv.end(), 0.0f);
      const float* row_lse = lse + (b * dims.heads + h) * dims.seq + block.query_chunk * chunk;
      reference::attention_block_backward(g.data(), q.data(), k.data(), v.data(), o.data(), row_lse, 1, chunk, chunk,
                                          dim, rows.places(), dropout, b, h, dq.data(), dk.data(), dv.data());
      for (std::size_t i = 0; i < chunk; ++i) {
        float* dq_row = dqkv + layout.query(b, rows.query_token(i), h);
        float* dk_row = dkv + packed_key(dims, b, rows.key_token(i), group);
        float* dv_row = dk_row + dim;
        for (std::size_t d = 0; d < dim; ++d) {
          dq_row[d] += dq[i * dim + d];
          dk_row[d] += dk[i * dim + d];
          dv_row[d] += dv[i * dim + d];
        }
      }
    }
  }
}

void CpuBackend::convert(const float* x, std::size_t n, Activation y) { std::copy_n(x, n, f(y)); }

void CpuBackend::zero(Activation x, std::size_t n) { std::fill_n(f(x), n, 0.0f); }

void CpuBackend::dropout(ConstActivation x, ConstActivation residual, std::size_t rows, std::size_t cols,
                         const DropoutMask& mask, Activation y) {
  reference::dropout(f(x), residual ? f(residual) : nullptr, rows, cols, mask, f(y));
}

void CpuBackend::cross_entropy_statistics(ConstActivation logits, const int64_t* targets, std::size_t tokens,
                                          std::size_t vocab, std::size_t vocab_start, float* lse, float* target_logit,
                                          float* peak) {
  reference::cross_entropy_statistics(f(logits), targets, tokens, vocab, vocab_start, lse, target_logit);
  if (peak) std::copy(lse, lse + tokens, peak);
}

void CpuBackend::cross_entropy_shift(const float* peak, std::size_t tokens, float* shard_lse) {
  reference::cross_entropy_shift(peak, tokens, shard_lse);
}

void CpuBackend::cross_entropy_finish(const float* peak, const float* term_sum, const float* target,
                                      const float* weights, std::size_t tokens, float* lse, double* loss_sum) {
  *loss_sum += reference::cross_entropy_finish(peak, term_sum, target, weights, tokens, lse);
}

void CpuBackend::cross_entropy_backward(ConstActivation logits, const float* lse, const int64_t* targets,
                                        const float* weights, std::size_t tokens, std::size_t vocab,
                                        std::size_t vocab_start, float scale, Activation dlogits) {
  reference::cross_entropy_backward(f(logits), lse, targets, weights, tokens, vocab, vocab_start, scale, f(dlogits));
}

void CpuBackend::add(ConstActivation a, ConstActivation b, std::size_t n, Activation y) {
  add_floats(f(a), f(b), n, f(y));
}

void CpuBackend::copy(ConstActivation from, std::size_t n, Activation to) { std::copy_n(f(from), n, f(to)); }

Activation CpuBackend::offset(Activation a, std::size_t elements) {
  return reinterpret_cast<Activation>(f(a) + elements);
}

double CpuBackend::gradient_sum_of_squares(const std::vector<OptimizerTensor>& tensors) {
  double sum = 0;
  for (const OptimizerTensor& tensor : tensors) {
    for (std::size_t i = 0; i < tensor.size; ++i) sum += static_cast<double>(tensor.gradient[i]) * tensor.gradient[i];
  }
  return sum;
}

void CpuBackend::adamw_step(const std::vector<OptimizerTensor>& tensors, const AdamwSettings& settings) {
  std::vector<float> scaled;
  for (const OptimizerTensor& tensor : tensors) {
    const float* gradient = tensor.gradient;
    if (settings.gradient_scale != 1.0) {
      const auto factor = static_cast<float>(settings.gradient_scale);
      scaled.assign(tensor.gradient, tensor.gradient + tensor.size);
      for (float& g : scaled) g *= factor;
      gradient = scaled.data();
    }
    reference::adamw_step(tensor.value, gradient, tensor.first_moment, tensor.second_moment, tensor.size, settings.step,
                          {settings.lr, settings.beta1, settings.beta2, settings.eps, tensor.weight_decay});
  }
}

TimingMark CpuBackend::mark() {
  marks_.push_back(std::chrono::steady_clock::now());
  return {marks_.size() - 1};
}

double CpuBackend::seconds_between(TimingMark from, TimingMark to) {
  return std::chrono::duration<double>(marks_.at(to.index) - marks_.at(from.index)).count();
}

}  // namespace megaplan::exec
