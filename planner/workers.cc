#include "planner/workers.h"

#include <algorithm>
#include <exception>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/input_limits.h"

namespace megaplan::planner {

int64_t worker_count(int64_t threads) {
  require_at_most(threads, kMaxThreads, "--threads");
  return threads > 0 ? threads : std::max<int64_t>(1, std::thread::hardware_concurrency());
}

void run_workers(int64_t threads, const std::function<void(std::atomic<bool>& stop)>& work) {
  std::atomic<bool> stop{false};
  std::mutex failure_mutex;
  std::exception_ptr failure;
  const auto guarded = [&] {
    try {
      work(stop);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
      stop.store(true);
    }
  };
  std::vector<std::thread> pool;
  try {
    for (int64_t t = 1; t < threads; ++t) pool.emplace_back(guarded);
  } catch (const std::system_error& error) {
    // The system ran out of threads: the started ones stop at their next item.
    stop.store(true);
    for (std::thread& thread : pool) thread.join();
    throw SpecError("--threads",
                    "cannot start " + std::to_string(threads) + " threads (" + error.what() + "); ask for fewer");
  }
  guarded();
  for (std::thread& thread : pool) thread.join();
  if (failure) std::rethrow_exception(failure);
}

void for_each_index(int64_t threads, std::size_t count, const std::function<void(std::size_t)>& work) {
  std::atomic<std::size_t> next{0};
  const int64_t used = std::min<int64_t>(threads, static_cast<int64_t>(count));
  if (used <= 0) return;
  // Runs of neighbouring indices, several per thread: neighbours tend to need the same memoised
  // values (a search's plans in enumeration order share their layers), which one thread then makes
  // while the other works elsewhere instead of waiting for it; the runs' number keeps the threads'
  // shares even.
  const std::size_t run = std::max<std::size_t>(1, count / (16 * static_cast<std::size_t>(used)));
  run_workers(used, [&](std::atomic<bool>& stop) {
    for (std::size_t first = next.fetch_add(run); first < count && !stop.load(); first = next.fetch_add(run)) {
      for (std::size_t i = first; i < std::min(count, first + run) && !stop.load(); ++i) work(i);
    }
  });
}

}  // namespace megaplan::planner
