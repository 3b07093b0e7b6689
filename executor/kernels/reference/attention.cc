#include "executor/kernels/reference/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "executor/kernels/reference/dropout.h"

namespace megaplan::exec::reference {

void attention_forward(const float* q, const float* k, const float* v, std::size_t heads, std::size_t seq,
                       std::size_t dim, const DropoutMask& dropout, std::size_t batch, std::size_t head, float* o,
                       float* probs) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  std::vector<double> scores(seq);
  for (std::size_t h = 0; h < heads; ++h) {
    const float* qh = q + h * seq * dim;
    const float* kh = k + h * seq * dim;
    const float* vh = v + h * seq * dim;
    for (std::size_t i = 0; i < seq; ++i) {
      double peak = -INFINITY;
      for (std::size_t j = 0; j <= i; ++j) {  // causal: keys up to the query's position
        double dot = 0;
        for (std::size_t d = 0; d < dim; ++d) dot += static_cast<double>(qh[i * dim + d]) * kh[j * dim + d];
        scores[j] = dot * scale;
        peak = std::max(peak, scores[j]);
      }
      double sum = 0;
      for (std::size_t j = 0; j <= i; ++j) sum += std::exp(scores[j] - peak);
      float* p = probs + (h * seq + i) * seq;
      std::fill(p, p + seq, 0.0f);
      for (std::size_t j = 0; j <= i; ++j) p[j] = static_cast<float>(std::exp(scores[j] - peak) / sum);
      for (std::size_t d = 0; d < dim; ++d) {
        double out = 0;
        for (std::size_t j = 0; j <= i; ++j) {
          out += static_cast<double>(p[j]) * probability_factor(dropout, batch, head + h, i, j) * vh[j * dim + d];
        }
        o[(h * seq + i) * dim + d] = static_cast<float>(out);
      }
    }
  }
}

void attention_backward(const float* d_o, const float* q, const float* k, const float* v, const float* probs,
                        std::size_t heads, std::size_t seq, std::size_t dim, const DropoutMask& dropout,
                        std::size_t batch, std::size_t head, float* dq, float* dk, float* dv) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  std::vector<double> dp(seq);
  std::vector<double> dk_acc(seq * dim), dv_acc(seq * dim);
  for (std::size_t h = 0; h < heads; ++h) {
    const std::size_t base = h * seq * dim;
    std::fill(dk_acc.begin(), dk_acc.end(), 0.0);
    std::fill(dv_acc.begin(), dv_acc.end(), 0.0);
    for (std::size_t i = 0; i < seq; ++i) {
      const float* p = probs + (h * seq + i) * seq;
      const float* g = d_o + base + i * dim;
      // With z the mask's factor: dV += (p z)^T dO; dP = (dO V^T) z; dS = p * (dP - sum(p * dP));
      // dQ = dS K scale; dK += dS^T Q scale.
      double row_dot = 0;
      for (std::size_t j = 0; j <= i; ++j) {
        const double z = probability_factor(dropout, batch, head + h, i, j);
        double value = 0;
        for (std::size_t d = 0; d < dim; ++d) {
          value += static_cast<double>(g[d]) * v[base + j * dim + d];
          dv_acc[j * dim + d] += static_cast<double>(p[j]) * z * g[d];
        }
        dp[j] = value * z;
        row_dot += p[j] * dp[j];
      }
      for (std::size_t d = 0; d < dim; ++d) {
        double grad_q = 0;
        for (std::size_t j = 0; j <= i; ++j) grad_q += p[j] * (dp[j] - row_dot) * k[base + j * dim + d];
        dq[base + i * dim + d] = static_cast<float>(grad_q * scale);
      }
      for (std::size_t j = 0; j <= i; ++j) {
        const double ds = p[j] * (dp[j] - row_dot) * scale;
        for (std::size_t d = 0; d < dim; ++d) dk_acc[j * dim + d] += ds * q[base + i * dim + d];
      }
    }
    for (std::size_t x = 0; x < seq * dim; ++x) {
      dk[base + x] = static_cast<float>(dk_acc[x]);
      dv[base + x] = static_cast<float>(dv_acc[x]);
    }
  }
}

}  // namespace megaplan::exec::reference
