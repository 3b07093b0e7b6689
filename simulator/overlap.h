// What communication and compute cost each other when they run at the same time on one GPU: NCCL's
// kernels take SMs and memory bandwidth from the GEMMs beside them, and the GEMMs from NCCL. Both
// sides are measured by `megaplan profile` (the profile's `overlap` table).
#pragma once

namespace megaplan::sim {

// How much longer each side takes while the other runs beside it the whole time, as fractions
// (0.1: 10% longer). 0 where nothing is measured.
struct OverlapSlowdown {
  double compute = 0;     // the compute, with a collective beside it
  double collective = 0;  // the collective, with compute beside it
};

// How long a collective that takes `collective_seconds` alone takes when compute runs beside it
// for its first `compute_window` seconds: (1 + collective_slowdown) times as long while it does,
// at its own speed after.
double collective_seconds_beside(double collective_seconds, double compute_window, double collective_slowdown);

// What compute loses over `beside_seconds` with communication running beside it: a
// compute_slowdown / (1 + compute_slowdown) share of that time.
double compute_lost_beside(double beside_seconds, double compute_slowdown);

// What a collective that takes `collective_seconds` alone adds to compute of `compute_seconds`
// when both start together. While both run, the compute goes at 1/(1 + slowdown.compute) of its
// speed and the collective at 1/(1 + slowdown.collective). Either the collective ends first (after
// collective x (1 + slowdown.collective)) and the compute lost a slowdown.compute / (1 +
// slowdown.compute) share of that time, or the compute ends first and the collective's rest runs
// alone after it.
double exposed_beside(double collective_seconds, double compute_seconds, OverlapSlowdown slowdown);

}  // namespace megaplan::sim
