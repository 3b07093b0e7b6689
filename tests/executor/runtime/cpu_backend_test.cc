// The CPU backend: its timing marks (the host's steady clock, since its work is done when issued) and
// its ring attention blocks (context parallelism).
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include "executor/runtime/cpu_backend.h"
#include "tests/executor/runtime/ring_attention_check.h"

TEST_CASE("CPU timing marks measure the host's time between them and are reused after release", "[timing]") {
  megaplan::exec::CpuBackend backend;
  const megaplan::exec::TimingMark start = backend.mark();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const megaplan::exec::TimingMark end = backend.mark();
  CHECK(backend.seconds_between(start, start) == 0);
  CHECK(backend.seconds_between(start, end) >= 0.005);
  CHECK(backend.seconds_between(start, end) < 5);  // a slow machine, not a wrong clock or unit

  backend.release_marks();
  CHECK(backend.mark().index == 0);                   // the marks start over: nothing accumulates across iterations
  CHECK_THROWS(backend.seconds_between(start, end));  // end is gone
}

TEST_CASE("CPU ring attention's blocks equal causal attention over the whole sequence", "[context_parallel]") {
  megaplan::exec::CpuBackend backend;
  for (const int64_t cp : {1, 2, 4}) {
    for (const float dropout : {0.0f, 0.25f}) {
      megaplan::test::RingAttentionCase ring;
      ring.cp = cp;
      ring.dropout = dropout;
      megaplan::test::check_ring_attention(backend, ring, 1e-5);
    }
  }
  megaplan::test::RingAttentionCase multi_head;  // one query head per group
  multi_head.groups = multi_head.heads;
  megaplan::test::check_ring_attention(backend, multi_head, 1e-5);
}
