#include "executor/kernels/reference/embedding.h"

#include <map>
#include <vector>

namespace megaplan::exec::reference {

void embedding_forward(const int64_t* tokens, std::size_t count, std::size_t seq, const float* word,
                       const float* position, std::size_t hidden, float* y) {
  for (std::size_t t = 0; t < count; ++t) {
    const float* w = word + static_cast<std::size_t>(tokens[t]) * hidden;
    const float* p = position ? position + (t % seq) * hidden : nullptr;
    for (std::size_t c = 0; c < hidden; ++c) {
      y[t * hidden + c] = static_cast<float>(static_cast<double>(w[c]) + (p ? p[c] : 0.0));
    }
  }
}

void embedding_backward(const float* dy, const int64_t* tokens, std::size_t count, std::size_t seq, std::size_t hidden,
                        float* dword, float* dposition) {
  // Each touched row's sum in double first, then one += per row: a row's result does not depend
  // on how often it was hit.
  std::map<int64_t, std::vector<double>> word_sums;
  std::vector<double> position_sums(dposition ? seq * hidden : 0, 0.0);
  for (std::size_t t = 0; t < count; ++t) {
    std::vector<double>& row = word_sums[tokens[t]];
    row.resize(hidden, 0.0);
    for (std::size_t c = 0; c < hidden; ++c) {
      row[c] += dy[t * hidden + c];
      if (dposition) position_sums[(t % seq) * hidden + c] += dy[t * hidden + c];
    }
  }
  for (const auto& [token, sums] : word_sums) {
    float* w = dword + static_cast<std::size_t>(token) * hidden;
    for (std::size_t c = 0; c < hidden; ++c) w[c] = static_cast<float>(w[c] + sums[c]);
  }
  for (std::size_t i = 0; i < position_sums.size(); ++i) {
    dposition[i] = static_cast<float>(dposition[i] + position_sums[i]);
  }
}

}  // namespace megaplan::exec::reference
