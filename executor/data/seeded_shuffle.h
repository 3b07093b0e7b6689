// The data's one source of randomness: Fisher-Yates on a 64-bit Mersenne Twister seeded with
// --seed, bounded draws by rejection. Reproducible on every standard library (no
// std::uniform_int_distribution, whose algorithm each library chooses), though not numpy's order.
// The sample indexes' builders call it for every shuffle, so that the draws they consume, and the
// generator's state they hand on, are one rule.
#pragma once

#include <cstdint>
#include <random>
#include <utility>

namespace megaplan::exec {

// Advances `generator` past one draw below `bound`, as uniform_below does, and returns the
// accepted raw draw. Draws at or above the largest multiple of `bound` are rejected; that limit
// costs a division, so it is computed only for draws that may reach it (it is at least
// 2^64 - bound). REQUIRES: bound > 0.
inline uint64_t accepted_draw(std::mt19937_64& generator, uint64_t bound) {
  uint64_t draw = generator();
  if (draw >= 0 - bound) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    while (draw >= limit) draw = generator();
  }
  return draw;
}

// A uniform integer in [0, bound). REQUIRES: bound > 0.
inline uint64_t uniform_below(std::mt19937_64& generator, uint64_t bound) {
  return accepted_draw(generator, bound) % bound;
}

// Fisher-Yates from the last element down: element i - 1 trades places with one drawn below i.
// The draws do not depend on the values, so a batch of them is drawn first and the elements they
// name are prefetched: an array of hundreds of millions is then bound by memory bandwidth, not by
// one cache miss after another.
template <typename T>
void shuffle(T* values, uint64_t count, std::mt19937_64& generator) {
  constexpr uint64_t kBatch = 256;
  uint64_t partners[kBatch];
  uint64_t i = count;
  while (i > 1) {
    const uint64_t batch = i - 1 < kBatch ? i - 1 : kBatch;
    for (uint64_t b = 0; b < batch; ++b) {
      partners[b] = uniform_below(generator, i - b);
      __builtin_prefetch(values + partners[b], 1);
    }
    for (uint64_t b = 0; b < batch; ++b) std::swap(values[i - 1 - b], values[partners[b]]);
    i -= batch;
  }
}

// Advances `generator` exactly as shuffle() of `count` elements would, without the elements.
inline void skip_shuffle(uint64_t count, std::mt19937_64& generator) {
  for (uint64_t i = count; i > 1; --i) accepted_draw(generator, i);
}

}  // namespace megaplan::exec
