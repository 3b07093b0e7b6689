// The planner's pool: a search's work spread over threads, this one among them.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>

namespace megaplan::planner {

// `threads` itself when positive, else one per core (at least one). Throws SpecError("--threads")
// above kMaxThreads.
int64_t worker_count(int64_t threads);

// Runs `work` on `threads` threads (this one among them) until each returns. `work` takes a stop
// flag: set when a thread fails or more cannot start, it should return at its next item. The first
// failure is rethrown here, after every thread has ended.
void run_workers(int64_t threads, const std::function<void(std::atomic<bool>& stop)>& work);

// `work(i)` for every i below `count`, on at most `threads` threads, each taking the next run of
// neighbouring i in turn.
void for_each_index(int64_t threads, std::size_t count, const std::function<void(std::size_t)>& work);

}  // namespace megaplan::planner
