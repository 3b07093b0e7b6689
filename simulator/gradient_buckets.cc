#include "simulator/gradient_buckets.h"

#include <algorithm>
#include <cmath>

namespace megaplan::sim {

namespace {

// One round: each bucket stretched for the part of it beside compute that runs `extra` longer than
// it was costed, and at its own speed after it.
BucketRun one_round(const BucketWindow& window, const std::vector<GradientBucketCost>& buckets,
                    const OverlapSlowdown& overlap, double extra) {
  const double filling = window.last_end - window.last_start + (window.compute_free > window.last_start ? extra : 0);
  const double busy_until = window.compute_free + extra;
  BucketRun run;
  double at = window.stream_free;
  double beside = 0;
  for (std::size_t k = 0; k < buckets.size(); ++k) {
    at = std::max(at, window.last_start + filling * buckets[k].ready);
    if (k == 0) run.start = at;
    const double compute_window = std::max(0.0, busy_until - at);
    const double took = collective_seconds_beside(buckets[k].seconds, compute_window, overlap.collective);
    beside += std::min(took, compute_window);
    at += took;
  }
  if (buckets.empty()) at = run.start = std::max(at, window.last_end);
  run.end = at;
  run.extra = compute_lost_beside(beside, overlap.compute);
  return run;
}

}  // namespace

BucketRun run_gradient_buckets(const BucketWindow& window, const std::vector<GradientBucketCost>& buckets,
                               const OverlapSlowdown& overlap) {
  BucketRun run;  // first round: nothing lost yet
  for (int round = 0; round < 64; ++round) {
    const BucketRun next = one_round(window, buckets, overlap, run.extra);
    const bool settled = std::abs(next.extra - run.extra) <= 1e-9;
    run = next;
    if (settled) break;
  }
  return run;
}

}  // namespace megaplan::sim
