// A one-line progress bar on stderr for long searches: drawn only when stderr is a terminal and
// the work has run longer than half a second, redrawn at most ten times a second, and erased when
// done, so piped output and short runs see nothing.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace megaplan::cli {

class ProgressBar {
 public:
  explicit ProgressBar(std::string what);
  ~ProgressBar();  // erases the line if one was drawn
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Not thread-safe: the caller serialises (search_plans calls its progress under a lock).
  void update(int64_t done, int64_t total);

 private:
  using Clock = std::chrono::steady_clock;
  std::string what_;
  bool terminal_;
  Clock::time_point start_;
  Clock::time_point last_draw_;
  bool drawn_ = false;
};

}  // namespace megaplan::cli
