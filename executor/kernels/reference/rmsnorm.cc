#include "executor/kernels/reference/rmsnorm.h"

#include <algorithm>
#include <cmath>

namespace megaplan::exec::reference {

void rmsnorm_forward(const float* x, const float* gamma, std::size_t rows, std::size_t cols, float eps, float* y,
                     float* rstd) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    double squares = 0;
    for (std::size_t c = 0; c < cols; ++c) squares += static_cast<double>(row[c]) * row[c];
    const double inverse = 1.0 / std::sqrt(squares / static_cast<double>(cols) + eps);
    for (std::size_t c = 0; c < cols; ++c) y[r * cols + c] = static_cast<float>(row[c] * inverse * gamma[c]);
    rstd[r] = static_cast<float>(inverse);
  }
}

void rmsnorm_backward(const float* dy, const float* x, const float* gamma, const float* rstd, std::size_t rows,
                      std::size_t cols, float* dx, float* dgamma) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    const float* grad = dy + r * cols;
    const double inverse = rstd[r];
    // With x_hat = x * rstd and g = dy * gamma: dx = rstd * (g - x_hat * mean(g * x_hat)); no
    // mean term, as RMSNorm does not centre.
    double gx_sum = 0;
    for (std::size_t c = 0; c < cols; ++c) {
      const double x_hat = row[c] * inverse;
      gx_sum += static_cast<double>(grad[c]) * gamma[c] * x_hat;
      dgamma[c] += static_cast<float>(grad[c] * x_hat);
    }
    const double gx_mean = gx_sum / static_cast<double>(cols);
    for (std::size_t c = 0; c < cols; ++c) {
      const double x_hat = row[c] * inverse;
      dx[r * cols + c] = static_cast<float>(inverse * (static_cast<double>(grad[c]) * gamma[c] - x_hat * gx_mean));
    }
  }
}

void head_rmsnorm_forward(const float* qkv, const float* q_gamma, const float* k_gamma, std::size_t tokens,
                          std::size_t groups, std::size_t group, std::size_t dim, float eps, float* y, float* rstd) {
  const std::size_t period = group + 2;  // a group's rows: its queries, its key, its value
  for (std::size_t row = 0; row < tokens * groups * period; ++row) {
    const std::size_t role = row % period;
    const float* in = qkv + row * dim;
    if (role == group + 1) {
      std::copy(in, in + dim, y + row * dim);
      rstd[row] = 0;
    } else {
      rmsnorm_forward(in, role < group ? q_gamma : k_gamma, 1, dim, eps, y + row * dim, rstd + row);
    }
  }
}

void head_rmsnorm_backward(const float* dy, const float* qkv, const float* q_gamma, const float* k_gamma,
                           const float* rstd, std::size_t tokens, std::size_t groups, std::size_t group,
                           std::size_t dim, float* dx, float* dq_gamma, float* dk_gamma) {
  const std::size_t period = group + 2;
  for (std::size_t row = 0; row < tokens * groups * period; ++row) {
    const std::size_t role = row % period;
    const float* grad = dy + row * dim;
    if (role == group + 1) {
      if (dx != dy) std::copy(grad, grad + dim, dx + row * dim);
    } else {
      const bool query = role < group;
      rmsnorm_backward(grad, qkv + row * dim, query ? q_gamma : k_gamma, rstd + row, 1, dim, dx + row * dim,
                       query ? dq_gamma : dk_gamma);
    }
  }
}

}  // namespace megaplan::exec::reference
