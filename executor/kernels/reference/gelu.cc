#include "executor/kernels/reference/gelu.h"

#include <cmath>
#include <numbers>

namespace megaplan::exec::reference {

namespace {
const double kScale = std::sqrt(2.0 / std::numbers::pi);
constexpr double kCubic = 0.044715;
}  // namespace

void gelu_forward(const float* x, std::size_t n, float* y) {
  for (std::size_t i = 0; i < n; ++i) {
    const double v = x[i];
    y[i] = static_cast<float>(0.5 * v * (1.0 + std::tanh(kScale * (v + kCubic * v * v * v))));
  }
}

void gelu_backward(const float* dy, const float* x, std::size_t n, float* dx) {
  for (std::size_t i = 0; i < n; ++i) {
    const double v = x[i];
    const double t = std::tanh(kScale * (v + kCubic * v * v * v));
    const double derivative = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * kScale * (1.0 + 3.0 * kCubic * v * v);
    dx[i] = static_cast<float>(dy[i] * derivative);
  }
}

}  // namespace megaplan::exec::reference
