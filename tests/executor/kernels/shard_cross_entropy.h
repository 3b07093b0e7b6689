// Megatron's vocabulary-parallel cross entropy on the host over every shard's row statistics at
// once, the group's two all-reduces done in place by hand (max, then sums in shard order), for the
// kernel tests that compare shards with the whole vocabulary without starting a group.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "executor/kernels/reference/cross_entropy.h"

namespace megaplan::test {

// statistics: `shards` blocks in shard order, each [lse[tokens], target_logit[tokens]].
inline double shard_cross_entropy(const std::vector<float>& statistics, std::size_t shards, const float* weights,
                                  std::size_t tokens, std::vector<float>& lse) {
  const auto block = [&](std::size_t shard) { return statistics.data() + shard * 2 * tokens; };
  std::vector<float> peak(block(0), block(0) + tokens);
  for (std::size_t s = 1; s < shards; ++s) {
    for (std::size_t t = 0; t < tokens; ++t) peak[t] = std::max(peak[t], block(s)[t]);
  }
  std::vector<float> sums(2 * tokens, 0.0f), terms(tokens);
  for (std::size_t s = 0; s < shards; ++s) {
    std::copy(block(s), block(s) + tokens, terms.begin());
    exec::reference::cross_entropy_shift(peak.data(), tokens, terms.data());
    for (std::size_t t = 0; t < tokens; ++t) {
      sums[t] += terms[t];
      sums[tokens + t] += block(s)[tokens + t];
    }
  }
  lse.resize(tokens);
  return exec::reference::cross_entropy_finish(peak.data(), sums.data(), sums.data() + tokens, weights, tokens,
                                               lse.data());
}

}  // namespace megaplan::test
