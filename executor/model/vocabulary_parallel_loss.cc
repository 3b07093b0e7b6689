#include "executor/model/vocabulary_parallel_loss.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace megaplan::exec {

double merge_cross_entropy(const std::vector<float>& statistics, std::size_t shards, const float* mask,
                           std::size_t tokens, std::vector<float>& lse) {
  if (statistics.size() != shards * 2 * tokens) throw std::logic_error("merge_cross_entropy: statistics size");
  lse.resize(tokens);
  double loss = 0, count = 0;
  for (std::size_t t = 0; t < tokens; ++t) {
    const auto at = [&](std::size_t shard, std::size_t which) { return statistics[(shard * 2 + which) * tokens + t]; };
    double row_lse = at(0, 0);
    double target = at(0, 1);
    if (shards > 1) {
      double peak = row_lse;
      for (std::size_t s = 1; s < shards; ++s) peak = std::max(peak, static_cast<double>(at(s, 0)));
      double sum = 0;
      for (std::size_t s = 0; s < shards; ++s) sum += std::exp(static_cast<double>(at(s, 0)) - peak);
      row_lse = peak + std::log(sum);
      for (std::size_t s = 1; s < shards; ++s) target += at(s, 1);
    }
    lse[t] = static_cast<float>(row_lse);
    loss += mask[t] * (row_lse - target);
    count += mask[t];
  }
  return count > 0 ? loss / count : 0.0;
}

}  // namespace megaplan::exec
