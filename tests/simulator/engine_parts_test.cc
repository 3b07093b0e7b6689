// The engine's parts on their own: the transfer rendezvous and the gradient buckets' settling
// (engine_test.cc runs them together through whole schedules).
#include <vector>

#include <catch2/catch.hpp>

#include "simulator/gradient_buckets.h"
#include "simulator/transfer_rendezvous.h"

using megaplan::sim::BucketRun;
using megaplan::sim::BucketWindow;
using megaplan::sim::GradientBucketCost;

TEST_CASE("a transfer starts when the second side reaches it, whichever that is", "[simulator][engine]") {
  megaplan::sim::KeyTimes first;
  CHECK_FALSE(megaplan::sim::reach_transfer(first, 3.0));   // the send
  CHECK(megaplan::sim::reach_transfer(first, 5.0) == 5.0);  // the receive came later
  megaplan::sim::KeyTimes second;
  CHECK_FALSE(megaplan::sim::reach_transfer(second, 4.0));   // the receive
  CHECK(megaplan::sim::reach_transfer(second, 2.5) == 4.0);  // the receive was waiting since 4
  megaplan::sim::KeyTimes at_zero;
  CHECK_FALSE(megaplan::sim::reach_transfer(at_zero, 0.0));  // time 0 is a time, not "not yet"
  CHECK(megaplan::sim::reach_transfer(at_zero, 0.0) == 0.0);
}

TEST_CASE("gradient buckets: alone they follow the backward; beside compute both sides slow", "[simulator][engine]") {
  // Two 1 s buckets ready at half and at the end of a backward over [0, 10]; the stream is free.
  const std::vector<GradientBucketCost> buckets = {{1, 0.5}, {1, 1}};
  const BucketWindow window{0, 0, 10, 10};
  BucketRun run = run_gradient_buckets(window, buckets, {});
  CHECK(run.start == Approx(5));
  CHECK(run.end == Approx(11));
  CHECK(run.extra == Approx(0));
  // Compute 100% slower beside them: the first bucket's 1 s beside it costs the compute 0.5 s,
  // which moves the backward's end, and the last bucket with it, to 10.5.
  run = run_gradient_buckets(window, buckets, {1, 0});
  CHECK(run.start == Approx(5.25));
  CHECK(run.extra == Approx(0.5));
  CHECK(run.end == Approx(11.5));
  // No buckets: the reduction ends with the backward.
  run = run_gradient_buckets(window, {}, {});
  CHECK(run.start == Approx(10));
  CHECK(run.end == Approx(10));
}
