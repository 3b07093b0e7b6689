#include "core/context_parallel.h"

#include <string>

#include "core/error.h"

namespace megaplan {

bool cuts_into_context_chunks(int64_t seq_length, int64_t cp) { return seq_length % (2 * cp) == 0; }

void require_context_chunks(int64_t seq_length, int64_t cp) {
  // Megatron cuts each sequence into 2 cp chunks to balance causal attention across the ranks.
  if (!cuts_into_context_chunks(seq_length, cp)) {
    const std::string chunks = std::to_string(2 * cp);
    throw SpecError("--context-parallel-size", "needs --seq-length divisible by 2*cp = " + chunks + " (" +
                                                   std::to_string(seq_length) + " % " + chunks + " = " +
                                                   std::to_string(seq_length % (2 * cp)) + ")");
  }
}

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
