#include "simulator/overlap.h"

namespace megaplan::sim {

double exposed_beside(double collective_seconds, double compute_seconds, OverlapSlowdown slowdown) {
  const double stretched = collective_seconds * (1 + slowdown.collective);
  const double compute_stretched = compute_seconds * (1 + slowdown.compute);
  if (stretched <= compute_stretched) return stretched * slowdown.compute / (1 + slowdown.compute);
  // The compute ended at compute_stretched; the collective had done compute_stretched / (1 +
  // slowdown.collective) of its work by then and does the rest alone.
  return compute_stretched + collective_seconds - compute_stretched / (1 + slowdown.collective) - compute_seconds;
}

}  // namespace megaplan::sim
