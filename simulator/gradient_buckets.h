// REDUCE_GRAD's buckets on a rank's data-parallel stream, as the engine runs them: a bucket may
// start once the stage's last backward is its `ready` fraction done (Megatron fills buckets
// during that backward), and while buckets reduce beside the rank's compute each side slows by
// the measured overlap (simulator/overlap.h).
#pragma once

#include <vector>

#include "simulator/overlap.h"

namespace megaplan::sim {

// One bucket of a stage's gradients: its reduction alone, and how far through the stage's last
// backward its gradients are all there (0 to 1; the word embedding's, only at the end).
struct GradientBucketCost {
  double seconds = 0;
  double ready = 1;
};

// When the stage's gradients fill: its last backward ran over [last_start, last_end]. The data-
// parallel stream is free from `stream_free`; the rank's compute issued so far runs until
// `compute_free`.
struct BucketWindow {
  double stream_free = 0;
  double last_start = 0;
  double last_end = 0;
  double compute_free = 0;
};

struct BucketRun {
  double start = 0;  // the first bucket's start
  double end = 0;    // the last one's end
  double extra = 0;  // what the compute issued so far loses to them
};

// The buckets' run, with the compute beside them slowed and the buckets slowed beside it. The
// compute running `extra` longer moves the backward's end and the buckets that wait for it, and so
// what runs beside: rounds settle it to a nanosecond (each changes the next by at most compute /
// (1 + compute) of its own change, a quarter at the slowdowns measured).
BucketRun run_gradient_buckets(const BucketWindow& window, const std::vector<GradientBucketCost>& buckets,
                               const OverlapSlowdown& overlap);

}  // namespace megaplan::sim
