#include "executor/kernels/reference/rmsnorm.h"

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

}  // namespace megaplan::exec::reference
