// Where a rank's tokens of each sequence lie in the whole sequence, for what depends on a token's
// place: learned position embeddings, rotary embeddings and dropout's masks. Without context
// parallelism a rank holds every token in order; with it, two chunks (core/context_parallel.h's
// context_chunks), so that its local token t sits at another place of the sequence. One definition
// for the CPU reference and the CUDA kernels.
#pragma once

#include <cstdint>

#include "executor/host_device.h"

namespace megaplan::exec {

struct TokenPlaces {
  int64_t chunk = 0;              // tokens per chunk; 0: the whole sequence, in order
  int64_t first = 0, second = 0;  // the chunks' numbers in the sequence (of 2 cp)

  // Tokens of each sequence the rank holds, given the whole sequence's length.
  MEGAPLAN_HOST_DEVICE int64_t local_length(int64_t seq) const { return chunk == 0 ? seq : 2 * chunk; }
  // The place in the sequence of the rank's token t (0 <= t < local_length).
  MEGAPLAN_HOST_DEVICE int64_t place(int64_t t) const {
    if (chunk == 0) return t;
    return t < chunk ? first * chunk + t : second * chunk + (t - chunk);
  }
};

}  // namespace megaplan::exec
