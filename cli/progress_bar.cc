#include "cli/progress_bar.h"

#include <unistd.h>
#include <cstdio>

namespace megaplan::cli {

ProgressBar::ProgressBar(std::string what)
    : what_(std::move(what)), terminal_(isatty(STDERR_FILENO) == 1), start_(Clock::now()), last_draw_(start_) {}

ProgressBar::~ProgressBar() {
  if (drawn_) std::fprintf(stderr, "\r\033[K");
}

void ProgressBar::update(int64_t done, int64_t total) {
  if (!terminal_ || total <= 0) return;
  const Clock::time_point now = Clock::now();
  if (now - start_ < std::chrono::milliseconds(500)) return;
  if (drawn_ && now - last_draw_ < std::chrono::milliseconds(100) && done < total) return;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * done / total);
  std::fprintf(stderr, "\r%s [%.*s%*s] %lld/%lld", what_.c_str(), filled, "##############################",
               kWidth - filled, "", static_cast<long long>(done), static_cast<long long>(total));
  std::fflush(stderr);
  drawn_ = true;
  last_draw_ = now;
}

}  // namespace megaplan::cli
