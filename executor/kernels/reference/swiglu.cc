#include "executor/kernels/reference/swiglu.h"

#include <cmath>

namespace megaplan::exec::reference {

namespace {
double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }
}  // namespace

void swiglu_forward(const float* x, std::size_t rows, std::size_t width, float* y) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* gate = x + r * 2 * width;
    const float* up = gate + width;
    for (std::size_t c = 0; c < width; ++c) {
      const double g = gate[c];
      y[r * width + c] = static_cast<float>(g * sigmoid(g) * up[c]);
    }
  }
}

void swiglu_backward(const float* dy, const float* x, std::size_t rows, std::size_t width, float* dx) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* gate = x + r * 2 * width;
    const float* up = gate + width;
    float* d_gate = dx + r * 2 * width;
    float* d_up = d_gate + width;
    for (std::size_t c = 0; c < width; ++c) {
      const double g = gate[c], s = sigmoid(g), grad = dy[r * width + c];
      // silu'(g) = s + g * s * (1 - s).
      d_gate[c] = static_cast<float>(grad * up[c] * s * (1.0 + g * (1.0 - s)));
      d_up[c] = static_cast<float>(grad * g * s);
    }
  }
}

}  // namespace megaplan::exec::reference
