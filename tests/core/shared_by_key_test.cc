// SharedByKey: one make per key however many threads ask, failures thrown to every asker, and a
// budget that forgets what it kept.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/shared_by_key.h"

using megaplan::SharedByKey;

TEST_CASE("threads asking for a key being made wait for it instead of making it again", "[core]") {
  SharedByKey<int, int> shared;
  std::atomic<int> makes{0};
  std::atomic<bool> release{false};
  const auto slow_make = [&] {
    ++makes;
    while (!release.load()) std::this_thread::yield();
    return 42;
  };
  std::vector<int> got(4, 0);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < got.size(); ++t) {
    threads.emplace_back([&, t] { got[t] = *shared.get(7, slow_make); });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let every thread ask while the first makes
  release.store(true);
  for (std::thread& thread : threads) thread.join();
  CHECK(makes.load() == 1);
  for (const int value : got) CHECK(value == 42);
  CHECK(*shared.get(8, [] { return 9; }) == 9);  // another key is made apart
}

TEST_CASE("what making a key threw reaches every asker", "[core]") {
  SharedByKey<int, int> shared;
  const auto failing = []() -> int { throw std::runtime_error("cannot make"); };
  CHECK_THROWS_WITH(shared.get(1, failing), "cannot make");
  CHECK_THROWS_WITH(shared.get(1, [] { return 1; }), "cannot make");  // the failure is what the key holds
}

TEST_CASE("a budget forgets every kept value when one more would pass it", "[core]") {
  SharedByKey<int, int> shared(10, [](const int& value) { return static_cast<std::size_t>(value); });
  int makes = 0;
  const auto make = [&](int value) {
    return [&makes, value] {
      ++makes;
      return value;
    };
  };
  CHECK(*shared.get(1, make(6)) == 6);
  CHECK(*shared.get(1, make(6)) == 6);
  CHECK(makes == 1);  // kept
  CHECK(*shared.get(2, make(6)) == 6);  // 6 + 6 > 10: key 1 forgotten, key 2 kept
  CHECK(*shared.get(2, make(6)) == 6);
  CHECK(makes == 2);
  CHECK(*shared.get(1, make(6)) == 6);
  CHECK(makes == 3);
  CHECK(*shared.get(3, make(11)) == 11);  // larger than the budget: returned, never kept
  CHECK(*shared.get(3, make(11)) == 11);
  CHECK(makes == 5);
}
