#include "executor/kernels/reference/cross_entropy.h"

#include <algorithm>
#include <cmath>

namespace megaplan::exec::reference {

namespace {
double mask_total(const float* mask, std::size_t tokens) {
  double total = 0;
  for (std::size_t t = 0; t < tokens; ++t) total += mask[t];
  return total;
}
}  // namespace

double cross_entropy_forward(const float* logits, const int64_t* targets, const float* mask, std::size_t tokens,
                             std::size_t vocab, float* token_losses, float* probs) {
  double loss = 0;
  for (std::size_t t = 0; t < tokens; ++t) {
    const float* row = logits + t * vocab;
    const float peak = *std::max_element(row, row + vocab);
    double sum = 0;
    for (std::size_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - peak);
    for (std::size_t v = 0; v < vocab; ++v) {
      probs[t * vocab + v] = static_cast<float>(std::exp(static_cast<double>(row[v]) - peak) / sum);
    }
    const double token_loss = std::log(sum) + peak - row[static_cast<std::size_t>(targets[t])];
    token_losses[t] = static_cast<float>(token_loss * mask[t]);
    loss += token_loss * mask[t];
  }
  const double total = mask_total(mask, tokens);
  return total > 0 ? loss / total : 0.0;
}

void cross_entropy_backward(const float* probs, const int64_t* targets, const float* mask, std::size_t tokens,
                            std::size_t vocab, float loss_gradient, float* dlogits) {
  const double total = mask_total(mask, tokens);
  const double scale = total > 0 ? loss_gradient / total : 0.0;
  for (std::size_t t = 0; t < tokens; ++t) {
    for (std::size_t v = 0; v < vocab; ++v) {
      const double onehot = v == static_cast<std::size_t>(targets[t]) ? 1.0 : 0.0;
      dlogits[t * vocab + v] = static_cast<float>((probs[t * vocab + v] - onehot) * mask[t] * scale);
    }
  }
}

}  // namespace megaplan::exec::reference
