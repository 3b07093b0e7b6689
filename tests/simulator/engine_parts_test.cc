// The engine's parts on their own: the event queue's order, the transfer rendezvous, and the
// gradient buckets' settling (engine_test.cc runs them together through whole schedules).
#include <set>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "simulator/event_queue.h"
#include "simulator/gradient_buckets.h"
#include "simulator/transfer_rendezvous.h"

using megaplan::sim::BucketRun;
using megaplan::sim::BucketWindow;
using megaplan::sim::GradientBucketCost;

TEST_CASE("the event queue gives completions by time, ties in the order they were scheduled", "[simulator][engine]") {
  megaplan::sim::EventQueue queue;
  queue.schedule(2.0, 0, 7);
  queue.schedule(1.0, 1, 3);
  queue.schedule(2.0, 1, 4);
  queue.schedule(1.0, 0, 5);
  std::vector<std::pair<uint32_t, uint32_t>> order;
  while (!queue.finished()) {
    const megaplan::sim::Completion next = queue.next();
    CHECK(queue.now() == next.time);
    order.emplace_back(next.rank, next.step);
  }
  CHECK(order == std::vector<std::pair<uint32_t, uint32_t>>{{1, 3}, {0, 5}, {0, 7}, {1, 4}});
  CHECK(queue.taken() == 4);
}

TEST_CASE("the event queue keeps that order through many interleaved schedules and takes", "[simulator][engine]") {
  // Against an ordered set of (time, issue number). Few distinct times, so that most completions
  // tie and the issue order decides; times never below the last taken, as the engine schedules them.
  megaplan::sim::EventQueue queue;
  std::set<std::pair<double, uint32_t>> pending;
  uint32_t issued = 0;
  uint64_t random = 12345;
  const auto draw = [&random](uint64_t below) {
    random = random * 6364136223846793005ULL + 1442695040888963407ULL;
    return (random >> 33) % below;
  };
  const auto take = [&] {
    REQUIRE(!pending.empty());
    const megaplan::sim::Completion next = queue.next();
    CHECK(std::pair(next.time, next.step) == *pending.begin());
    CHECK(queue.now() == next.time);
    pending.erase(pending.begin());
  };
  for (int round = 0; round < 3000; ++round) {
    for (uint64_t n = draw(4); n > 0; --n) {
      const double time = queue.now() + static_cast<double>(draw(3));
      queue.schedule(time, 0, issued);
      pending.emplace(time, issued++);
    }
    if (!queue.finished() && draw(5) < 3) take();
  }
  while (!queue.finished()) take();
  CHECK(pending.empty());
  CHECK(queue.taken() == static_cast<int64_t>(issued));
}

TEST_CASE("a transfer starts when the second side reaches it, whichever that is", "[simulator][engine]") {
  megaplan::sim::TransferRendezvous transfers(2);
  CHECK_FALSE(transfers.reach_send(0, 3.0));
  CHECK(transfers.reach_receive(0, 5.0) == 5.0);  // the receive came later
  CHECK_FALSE(transfers.reach_receive(1, 4.0));
  CHECK(transfers.reach_send(1, 2.5) == 4.0);  // the receive was waiting since 4
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
