// run_rank_threads: a thread per rank, the first failure aborts the world, its exception comes out.
#include "executor/comm/rank_threads.h"

#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace megaplan::exec {
namespace {

std::string describe(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

bool is_comm_aborted(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const CommAborted&) {
    return true;
  } catch (...) {
    return false;
  }
}

// The failures in the order they were caught. A rank records its failure before it aborts the
// world, so the root cause is recorded before any CommAborted it causes.
class Failures {
 public:
  void record(std::exception_ptr error) {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (!is_comm_aborted(error)) {
      if (!root_cause_) root_cause_ = error;
    } else if (!first_abort_) {
      first_abort_ = error;
    }
  }
  // After every thread has been joined.
  std::exception_ptr first() const { return root_cause_ ? root_cause_ : first_abort_; }

 private:
  std::mutex mutex_;
  std::exception_ptr root_cause_;   // the first failure that is not CommAborted
  std::exception_ptr first_abort_;  // the first CommAborted
};

}  // namespace

void run_rank_threads(InProcessWorld& world, int64_t world_size, const std::function<void(int64_t rank)>& body) {
  if (world_size <= 0 || world_size > world.world_size()) {
    throw std::invalid_argument("run_rank_threads: " + std::to_string(world_size) + " ranks for a world of " +
                                std::to_string(world.world_size()));
  }
  Failures failures;
  auto run_rank = [&](int64_t rank) {
    try {
      body(rank);
    } catch (...) {
      const std::exception_ptr error = std::current_exception();
      failures.record(error);
      world.abort("rank " + std::to_string(rank) + ": " + describe(error));
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(world_size));
  try {
    for (int64_t rank = 0; rank < world_size; ++rank) threads.emplace_back(run_rank, rank);
  } catch (...) {
    // No thread for this rank: end the ones already running before reporting why.
    world.abort("run_rank_threads: could not start rank " + std::to_string(threads.size()) + ": " +
                describe(std::current_exception()));
    for (std::thread& thread : threads) thread.join();
    throw;
  }
  for (std::thread& thread : threads) thread.join();
  if (const std::exception_ptr error = failures.first()) std::rethrow_exception(error);
}

}  // namespace megaplan::exec
