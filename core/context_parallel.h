// Megatron-Core's context parallelism as Transformer Engine runs it over point-to-point sends (the
// "p2p" ring, --cp-comm-type p2p): how a sequence is cut among the cp ranks and which attention
// blocks each step of the ring computes. One home for the rule the executor's ring runs and the
// simulator costs.
//
// The sequence is cut into 2 cp chunks of seq / (2 cp) tokens, and rank r holds chunks r and
// 2 cp - 1 - r: with a causal mask a late chunk attends to more keys than an early one, and the
// pairs balance (every rank's two chunks see 2 cp + 1 chunks of keys between them).
// At step i the rank holds the keys and values of rank (r - i) mod cp, sent around the ring:
// - step 0, its own: the causal triangle of its two chunks (each chunk against itself under the
//   mask, the second against the first whole);
// - steps 1 <= i <= r, a rank before it: the source's first chunk precedes both of the rank's and
//   its second follows both, so both query chunks attend to the first key chunk, unmasked;
// - steps i > r, a rank after it: the source's chunks both lie between the rank's two, so only the
//   second query chunk attends, to both key chunks, unmasked.
// Every step after the first is two chunk blocks without a mask, the same work on every rank.
#pragma once

#include <array>
#include <cstdint>

namespace megaplan {

// Whether a sequence of `seq_length` tokens cuts into 2 cp equal chunks; and the same as a check
// that throws SpecError("--context-parallel-size", ...) when it does not. REQUIRES: cp >= 1.
bool cuts_into_context_chunks(int64_t seq_length, int64_t cp);
void require_context_chunks(int64_t seq_length, int64_t cp);

// The two chunks (of 2 cp) that rank `rank` of a context-parallel group of `cp` holds, in sequence
// order. REQUIRES: 0 <= rank < cp.
std::array<int64_t, 2> context_chunks(int64_t rank, int64_t cp);

// One block of a ring step: the rank's query chunk (0 or 1, as context_chunks orders them) against
// the source's key-value chunk (likewise); `diagonal`: the same chunk, masked causally inside, else
// every key precedes every query.
struct AttentionBlock {
  int query_chunk = 0;
  int key_chunk = 0;
  bool diagonal = false;
  bool operator==(const AttentionBlock&) const = default;
};

struct RingStep {
  int64_t source = 0;  // the rank whose keys and values this step uses
  std::array<AttentionBlock, 3> blocks{};
  int count = 0;  // blocks[0 .. count)
};

// Step `step` of rank `rank`'s ring. REQUIRES: 0 <= rank, step < cp.
RingStep ring_step(int64_t rank, int64_t step, int64_t cp);

}  // namespace megaplan
