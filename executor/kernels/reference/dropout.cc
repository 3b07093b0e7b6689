#include "executor/kernels/reference/dropout.h"

namespace megaplan::exec::reference {

void dropout(const float* x, const float* residual, std::size_t rows, std::size_t cols, const DropoutMask& mask,
             float* y) {
  const float scale = mask.scale();
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < cols; ++c) {
      const std::size_t i = r * cols + c;
      const bool kept = !mask.active() ||
                        mask.keeps_token(static_cast<int64_t>(r), static_cast<int64_t>(c), static_cast<int64_t>(cols));
      const float dropped = kept ? x[i] * scale : 0.0f;
      y[i] = residual ? residual[i] + dropped : dropped;
    }
  }
}

double probability_factor(const DropoutMask& mask, std::size_t batch, std::size_t head, std::size_t query,
                          std::size_t key) {
  if (!mask.active()) return 1;
  const auto at = [](std::size_t n) { return static_cast<int64_t>(n); };
  return mask.keeps_probability(at(batch), at(head), at(query), at(key)) ? static_cast<double>(mask.scale()) : 0;
}

}  // namespace megaplan::exec::reference
