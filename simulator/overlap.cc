#include "simulator/overlap.h"

namespace megaplan::sim {

double collective_seconds_beside(double collective_seconds, double compute_window, double collective_slowdown) {
  const double stretched = collective_seconds * (1 + collective_slowdown);
  if (stretched <= compute_window) return stretched;
  // By the window's end it had done compute_window / (1 + collective_slowdown) of its work.
  return compute_window + collective_seconds - compute_window / (1 + collective_slowdown);
}

double compute_lost_beside(double beside_seconds, double compute_slowdown) {
  return beside_seconds * compute_slowdown / (1 + compute_slowdown);
}

double exposed_beside(double collective_seconds, double compute_seconds, OverlapSlowdown slowdown) {
  // The compute, slowed the whole time the collective runs, lasts at most this long.
  const double compute_stretched = compute_seconds * (1 + slowdown.compute);
  const double took = collective_seconds_beside(collective_seconds, compute_stretched, slowdown.collective);
  if (took <= compute_stretched) return compute_lost_beside(took, slowdown.compute);
  return took - compute_seconds;  // the compute ended first; the collective's rest ran alone
}

}  // namespace megaplan::sim
