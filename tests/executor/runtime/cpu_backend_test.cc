// The CPU backend's timing marks: the host's steady clock, since its work is done when issued.
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include "executor/runtime/cpu_backend.h"

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
