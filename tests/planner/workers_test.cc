// The planner's pool: every item once, failures rethrown after every thread has ended.
#include <catch2/catch.hpp>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "core/error.h"
#include "planner/workers.h"

using megaplan::planner::for_each_index;

TEST_CASE("each index is visited exactly once, whatever the thread count", "[planner]") {
  for (const int64_t threads : {1, 2, 5, 64}) {
    for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{1000}}) {
      std::vector<std::atomic<int>> visits(count);
      for_each_index(threads, count, [&](std::size_t i) { visits[i].fetch_add(1); });
      for (std::size_t i = 0; i < count; ++i) CHECK(visits[i].load() == 1);
    }
  }
}

TEST_CASE("a failing item's exception reaches the caller and stops the others", "[planner]") {
  std::atomic<int> done{0};
  CHECK_THROWS_WITH(for_each_index(4, 100000,
                                   [&](std::size_t i) {
                                     if (i == 10) throw std::runtime_error("item 10 failed");
                                     done.fetch_add(1);
                                   }),
                    "item 10 failed");
  CHECK(done.load() < 99999);  // the threads stopped at their next item
}

TEST_CASE("the thread count: all cores for 0, refused above the limit", "[planner]") {
  CHECK(megaplan::planner::worker_count(3) == 3);
  CHECK(megaplan::planner::worker_count(0) >= 1);
  CHECK_THROWS_AS(megaplan::planner::worker_count(100000), megaplan::SpecError);
}
