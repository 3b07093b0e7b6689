#include "executor/io/parallel_tasks.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace megaplan::exec {

void run_tasks(std::size_t count, int64_t threads, const std::function<void(std::size_t)>& task) {
  std::atomic<std::size_t> next{0};
  std::mutex failure_mutex;
  std::exception_ptr failure;
  const auto work = [&] {
    for (std::size_t i = next++; i < count; i = next++) {
      try {
        task(i);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure) failure = std::current_exception();
        next = count;  // no thread takes another task
      }
    }
  };
  const int64_t helpers = std::min<int64_t>(threads, static_cast<int64_t>(count)) - 1;
  std::vector<std::thread> started;
  std::exception_ptr spawn_failure;  // raised once the threads that did start are joined
  try {
    for (int64_t t = 0; t < helpers; ++t) started.emplace_back(work);
  } catch (...) {
    spawn_failure = std::current_exception();
  }
  work();
  for (std::thread& thread : started) thread.join();
  if (failure) std::rethrow_exception(failure);
  if (spawn_failure) std::rethrow_exception(spawn_failure);
}

int64_t default_checkpoint_threads() {
  constexpr int64_t kMostThreads = 8;
  const auto hardware = static_cast<int64_t>(std::thread::hardware_concurrency());
  return std::clamp<int64_t>(hardware, 1, kMostThreads);
}

}  // namespace megaplan::exec
