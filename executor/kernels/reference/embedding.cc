#include "executor/kernels/reference/embedding.h"

#include <map>
#include <vector>

namespace megaplan::exec::reference {

namespace {
// The token's row in the shard, or -1 when another shard holds it.
int64_t shard_row(int64_t token, std::size_t vocab_start, std::size_t vocab_rows) {
  const int64_t row = token - static_cast<int64_t>(vocab_start);
  return row >= 0 && row < static_cast<int64_t>(vocab_rows) ? row : -1;
}
}  // namespace

void embedding_forward(const int64_t* tokens, std::size_t count, std::size_t seq, const float* word,
                       std::size_t vocab_start, std::size_t vocab_rows, const float* position, std::size_t hidden,
                       float* y, const TokenPlaces& places) {
  for (std::size_t t = 0; t < count; ++t) {
    const int64_t row = shard_row(tokens[t], vocab_start, vocab_rows);
    const float* w = row >= 0 ? word + static_cast<std::size_t>(row) * hidden : nullptr;
    const float* p =
        position ? position + static_cast<std::size_t>(places.place(static_cast<int64_t>(t % seq))) * hidden : nullptr;
    for (std::size_t c = 0; c < hidden; ++c) {
      y[t * hidden + c] = static_cast<float>((w ? static_cast<double>(w[c]) : 0.0) + (p ? p[c] : 0.0));
    }
  }
}

void embedding_backward(const float* dy, const int64_t* tokens, std::size_t count, std::size_t seq, std::size_t hidden,
                        std::size_t vocab_start, std::size_t vocab_rows, float* dword, float* dposition,
                        const TokenPlaces& places) {
  // Each touched row's sum in double first, then one += per row: a row's result does not depend
  // on how often it was hit.
  std::map<int64_t, std::vector<double>> word_sums;
  std::vector<double> position_sums(dposition ? seq * hidden : 0, 0.0);
  for (std::size_t t = 0; t < count; ++t) {
    const int64_t shard = shard_row(tokens[t], vocab_start, vocab_rows);
    std::vector<double>* row = shard >= 0 ? &word_sums[shard] : nullptr;
    if (row) row->resize(hidden, 0.0);
    for (std::size_t c = 0; c < hidden; ++c) {
      if (row) (*row)[c] += dy[t * hidden + c];
      if (dposition) position_sums[(t % seq) * hidden + c] += dy[t * hidden + c];
    }
  }
  for (const auto& [row, sums] : word_sums) {
    float* w = dword + static_cast<std::size_t>(row) * hidden;
    for (std::size_t c = 0; c < hidden; ++c) w[c] = static_cast<float>(w[c] + sums[c]);
  }
  for (std::size_t s = 0; dposition && s < seq; ++s) {  // the rank's tokens at their places
    float* p = dposition + static_cast<std::size_t>(places.place(static_cast<int64_t>(s))) * hidden;
    for (std::size_t c = 0; c < hidden; ++c) p[c] = static_cast<float>(p[c] + position_sums[s * hidden + c]);
  }
}

}  // namespace megaplan::exec::reference
