#include "core/context_parallel.h"

namespace megaplan {

std::array<int64_t, 2> context_chunks(int64_t rank, int64_t cp) { return {rank, 2 * cp - 1 - rank}; }

RingStep ring_step(int64_t rank, int64_t step, int64_t cp) {
  RingStep result;
  result.source = ((rank - step) % cp + cp) % cp;
  const auto add = [&](int query, int key, bool diagonal) { result.blocks[result.count++] = {query, key, diagonal}; };
  if (step == 0) {
    add(0, 0, true);
    add(1, 0, false);
    add(1, 1, true);
  } else if (step <= rank) {
    add(0, 0, false);
    add(1, 0, false);
  } else {
    add(1, 0, false);
    add(1, 1, false);
  }
  return result;
}

}  // namespace megaplan
