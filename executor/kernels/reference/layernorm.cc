#include "executor/kernels/reference/layernorm.h"

#include <cmath>

namespace megaplan::exec::reference {

void layernorm_forward(const float* x, const float* gamma, const float* beta, std::size_t rows, std::size_t cols,
                       float eps, float* y, float* mean, float* rstd) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    double sum = 0;
    for (std::size_t c = 0; c < cols; ++c) sum += row[c];
    const double mu = sum / static_cast<double>(cols);
    double squares = 0;
    for (std::size_t c = 0; c < cols; ++c) squares += (row[c] - mu) * (row[c] - mu);
    const double inverse = 1.0 / std::sqrt(squares / static_cast<double>(cols) + eps);
    for (std::size_t c = 0; c < cols; ++c) {
      y[r * cols + c] = static_cast<float>((row[c] - mu) * inverse * gamma[c] + beta[c]);
    }
    mean[r] = static_cast<float>(mu);
    rstd[r] = static_cast<float>(inverse);
  }
}

void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean, const float* rstd,
                        std::size_t rows, std::size_t cols, float* dx, float* dgamma, float* dbeta) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    const float* grad = dy + r * cols;
    // With x_hat = (x - mean) * rstd and g = dy * gamma:
    // dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)).
    double g_sum = 0;
    double gx_sum = 0;
    for (std::size_t c = 0; c < cols; ++c) {
      const double x_hat = (row[c] - mean[r]) * static_cast<double>(rstd[r]);
      const double g = static_cast<double>(grad[c]) * gamma[c];
      g_sum += g;
      gx_sum += g * x_hat;
      dgamma[c] += static_cast<float>(grad[c] * x_hat);
      dbeta[c] += grad[c];
    }
    const double n = static_cast<double>(cols);
    for (std::size_t c = 0; c < cols; ++c) {
      const double x_hat = (row[c] - mean[r]) * static_cast<double>(rstd[r]);
      const double g = static_cast<double>(grad[c]) * gamma[c];
      dx[r * cols + c] = static_cast<float>(rstd[r] * (g - g_sum / n - x_hat * gx_sum / n));
    }
  }
}

}  // namespace megaplan::exec::reference
