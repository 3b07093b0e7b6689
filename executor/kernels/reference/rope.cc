#include "executor/kernels/reference/rope.h"

#include <cmath>
#include <vector>

namespace megaplan::exec::reference {

void rope_apply(float* base, std::size_t batch, std::size_t seq, std::size_t heads, std::size_t head_dim,
                std::size_t token_stride, std::size_t rotary_dim, const RotaryFrequencies& frequencies, bool inverse,
                const TokenPlaces& places) {
  const std::size_t half = rotary_dim / 2;
  std::vector<double> inverse_frequency(half);
  for (std::size_t i = 0; i < half; ++i) {
    inverse_frequency[i] = scaled_inverse_frequency(
        std::pow(frequencies.theta, -2.0 * static_cast<double>(i) / static_cast<double>(rotary_dim)), frequencies);
  }
  for (std::size_t b = 0; b < batch; ++b) {
    for (std::size_t t = 0; t < seq; ++t) {
      for (std::size_t h = 0; h < heads; ++h) {
        float* head = base + (b * seq + t) * token_stride + h * head_dim;
        for (std::size_t i = 0; i < half; ++i) {
          const double angle = static_cast<double>(places.place(static_cast<int64_t>(t))) * inverse_frequency[i];
          const double cosine = std::cos(angle), sine = inverse ? -std::sin(angle) : std::sin(angle);
          const double x1 = head[i], x2 = head[i + half];
          head[i] = static_cast<float>(x1 * cosine - x2 * sine);
          head[i + half] = static_cast<float>(x2 * cosine + x1 * sine);
        }
      }
    }
  }
}

}  // namespace megaplan::exec::reference
