// Megatron-Core's context-parallel ring (Transformer Engine's p2p): the chunks each rank holds and
// the blocks each step computes, against the causal triangle they must cover.
#include "core/context_parallel.h"

#include <map>
#include <utility>

#include <catch2/catch.hpp>

using megaplan::context_chunks;
using megaplan::ring_step;

TEST_CASE("context parallelism's chunks: rank r holds r and 2 cp - 1 - r", "[core][context_parallel]") {
  CHECK(context_chunks(0, 1) == std::array<int64_t, 2>{0, 1});
  CHECK(context_chunks(0, 4) == std::array<int64_t, 2>{0, 7});
  CHECK(context_chunks(3, 4) == std::array<int64_t, 2>{3, 4});
}

TEST_CASE("the ring's steps cover the causal triangle of chunks once, with the same work on every rank",
          "[core][context_parallel]") {
  for (const int64_t cp : {1, 2, 3, 4, 8}) {
    // (query chunk, key chunk) of the whole sequence -> how often computed, and whether masked.
    std::map<std::pair<int64_t, int64_t>, int> computed;
    std::map<std::pair<int64_t, int64_t>, bool> masked;
    for (int64_t rank = 0; rank < cp; ++rank) {
      std::map<int64_t, int> sources;
      for (int64_t step = 0; step < cp; ++step) {
        const megaplan::RingStep ring = ring_step(rank, step, cp);
        ++sources[ring.source];
        CHECK(ring.source == (rank - step + cp) % cp);
        double work = 0;  // in chunk blocks; a diagonal block is half of one
        for (int b = 0; b < ring.count; ++b) {
          const megaplan::AttentionBlock& block = ring.blocks[static_cast<std::size_t>(b)];
          const int64_t query = context_chunks(rank, cp)[static_cast<std::size_t>(block.query_chunk)];
          const int64_t key = context_chunks(ring.source, cp)[static_cast<std::size_t>(block.key_chunk)];
          ++computed[{query, key}];
          masked[{query, key}] = block.diagonal;
          work += block.diagonal ? 0.5 : 1.0;
        }
        CHECK(work == 2.0);  // step 0: two masked halves and one whole; later steps: two wholes
      }
      CHECK(sources.size() == static_cast<std::size_t>(cp));  // every rank's keys, once
    }
    for (int64_t query = 0; query < 2 * cp; ++query) {
      for (int64_t key = 0; key < 2 * cp; ++key) {
        const auto at = std::make_pair(query, key);
        if (key > query) {
          CHECK(computed.count(at) == 0);  // wholly in the future: skipped
        } else {
          CHECK(computed[at] == 1);
          CHECK(masked[at] == (key == query));
        }
      }
    }
  }
}
