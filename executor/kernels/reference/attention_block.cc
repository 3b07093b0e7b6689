#include "executor/kernels/reference/attention_block.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "executor/kernels/reference/dropout.h"

namespace megaplan::exec::reference {

namespace {

bool visible(BlockPlaces places, std::size_t i, std::size_t j) { return places.kv_first + j <= places.q_first + i; }

double scaled_dot(const float* a, const float* b, std::size_t dim) {
  double dot = 0;
  for (std::size_t d = 0; d < dim; ++d) dot += static_cast<double>(a[d]) * b[d];
  return dot / std::sqrt(static_cast<double>(dim));
}

}  // namespace

void attention_block_forward(const float* q, const float* k, const float* v, std::size_t heads, std::size_t q_len,
                             std::size_t kv_len, std::size_t dim, BlockPlaces places, const DropoutMask& dropout,
                             std::size_t batch, std::size_t head, float* o, float* lse) {
  std::vector<double> scores(kv_len);
  for (std::size_t h = 0; h < heads; ++h) {
    for (std::size_t i = 0; i < q_len; ++i) {
      double peak = -INFINITY;
      for (std::size_t j = 0; j < kv_len && visible(places, i, j); ++j) {
        scores[j] = scaled_dot(q + (h * q_len + i) * dim, k + (h * kv_len + j) * dim, dim);
        peak = std::max(peak, scores[j]);
      }
      float* out = o + (h * q_len + i) * dim;
      std::fill(out, out + dim, 0.0f);
      if (peak == -INFINITY) {
        lse[h * q_len + i] = -INFINITY;
        continue;
      }
      double sum = 0;
      for (std::size_t j = 0; j < kv_len && visible(places, i, j); ++j) sum += std::exp(scores[j] - peak);
      lse[h * q_len + i] = static_cast<float>(peak + std::log(sum));
      for (std::size_t d = 0; d < dim; ++d) {
        double value = 0;
        for (std::size_t j = 0; j < kv_len && visible(places, i, j); ++j) {
          const double p = std::exp(scores[j] - peak) / sum;
          value += p * probability_factor(dropout, batch, head + h, places.q_first + i, places.kv_first + j) *
                   v[(h * kv_len + j) * dim + d];
        }
        out[d] = static_cast<float>(value);
      }
    }
  }
}

void merge_attention_block(float* o, float* lse, const float* block_o, const float* block_lse, std::size_t heads,
                           std::size_t rows, std::size_t dim) {
  for (std::size_t row = 0; row < heads * rows; ++row) {
    const double a = lse[row], b = block_lse[row];
    if (b == -INFINITY) continue;
    const double merged = a == -INFINITY ? b : std::max(a, b) + std::log1p(std::exp(-std::abs(a - b)));
    const double keep = a == -INFINITY ? 0 : std::exp(a - merged), take = std::exp(b - merged);
    for (std::size_t d = 0; d < dim; ++d) {
      o[row * dim + d] = static_cast<float>(keep * o[row * dim + d] + take * block_o[row * dim + d]);
    }
    lse[row] = static_cast<float>(merged);
  }
}

void attention_block_backward(const float* d_o, const float* q, const float* k, const float* v, const float* o,
                              const float* lse, std::size_t heads, std::size_t q_len, std::size_t kv_len,
                              std::size_t dim, BlockPlaces places, const DropoutMask& dropout, std::size_t batch,
                              std::size_t head, float* dq, float* dk, float* dv) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  for (std::size_t h = 0; h < heads; ++h) {
    for (std::size_t i = 0; i < q_len; ++i) {
      const float* g = d_o + (h * q_len + i) * dim;
      const float* qi = q + (h * q_len + i) * dim;
      // With P = exp(s - lse) over the whole row and z the mask's factor: D = rowsum(dO o) =
      // sum_j P z (dO . v_j); dS = P (z dO . v_j - D); dQ += dS K scale; dK += dS^T Q scale;
      // dV += (P z)^T dO.
      double row_dot = 0;
      for (std::size_t d = 0; d < dim; ++d) row_dot += static_cast<double>(g[d]) * o[(h * q_len + i) * dim + d];
      for (std::size_t j = 0; j < kv_len && visible(places, i, j); ++j) {
        const float* kj = k + (h * kv_len + j) * dim;
        const float* vj = v + (h * kv_len + j) * dim;
        const double p = std::exp(scaled_dot(qi, kj, dim) - lse[h * q_len + i]);
        const double z = probability_factor(dropout, batch, head + h, places.q_first + i, places.kv_first + j);
        double dp = 0;
        for (std::size_t d = 0; d < dim; ++d) dp += static_cast<double>(g[d]) * vj[d];
        const double ds = p * (z * dp - row_dot) * scale;
        for (std::size_t d = 0; d < dim; ++d) {
          dq[(h * q_len + i) * dim + d] += static_cast<float>(ds * kj[d]);
          dk[(h * kv_len + j) * dim + d] += static_cast<float>(ds * qi[d]);
          dv[(h * kv_len + j) * dim + d] += static_cast<float>(p * z * g[d]);
        }
      }
    }
  }
}

}  // namespace megaplan::exec::reference
