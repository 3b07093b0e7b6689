#include "executor/kernels/reference/cross_entropy.h"

#include <algorithm>
#include <cmath>

namespace megaplan::exec::reference {

namespace {
// The target's column in the shard, or -1 when another shard holds it.
int64_t local_target(int64_t target, std::size_t vocab, std::size_t vocab_start) {
  const int64_t local = target - static_cast<int64_t>(vocab_start);
  return local >= 0 && local < static_cast<int64_t>(vocab) ? local : -1;
}
}  // namespace

void cross_entropy_statistics(const float* logits, const int64_t* targets, std::size_t tokens, std::size_t vocab,
                              std::size_t vocab_start, float* lse, float* target_logit) {
  for (std::size_t t = 0; t < tokens; ++t) {
    const float* row = logits + t * vocab;
    const float peak = *std::max_element(row, row + vocab);
    double sum = 0;
    for (std::size_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - peak);
    lse[t] = static_cast<float>(std::log(sum) + peak);
    const int64_t local = local_target(targets[t], vocab, vocab_start);
    target_logit[t] = local >= 0 ? row[local] : 0.0f;
  }
}

void cross_entropy_backward(const float* logits, const float* lse, const int64_t* targets, const float* weights,
                            std::size_t tokens, std::size_t vocab, std::size_t vocab_start, float loss_gradient,
                            float* dlogits) {
  for (std::size_t t = 0; t < tokens; ++t) {
    const int64_t local = local_target(targets[t], vocab, vocab_start);
    for (std::size_t v = 0; v < vocab; ++v) {
      const double probability = std::exp(static_cast<double>(logits[t * vocab + v]) - lse[t]);
      const double onehot = static_cast<int64_t>(v) == local ? 1.0 : 0.0;
      dlogits[t * vocab + v] = static_cast<float>((probability - onehot) * weights[t] * loss_gradient);
    }
  }
}

void cross_entropy_shift(const float* peak, std::size_t tokens, float* shard_lse) {
  for (std::size_t t = 0; t < tokens; ++t) {
    shard_lse[t] = static_cast<float>(std::exp(static_cast<double>(shard_lse[t]) - static_cast<double>(peak[t])));
  }
}

double cross_entropy_finish(const float* peak, const float* term_sum, const float* target, const float* weights,
                            std::size_t tokens, float* lse) {
  double loss = 0;
  for (std::size_t t = 0; t < tokens; ++t) {
    const double row_lse = static_cast<double>(peak[t]) + (term_sum ? std::log(static_cast<double>(term_sum[t])) : 0.0);
    lse[t] = static_cast<float>(row_lse);
    loss += weights[t] * (row_lse - target[t]);
  }
  return loss;
}

}  // namespace megaplan::exec::reference
