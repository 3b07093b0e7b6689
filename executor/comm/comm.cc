// The words every Comm implementation's error messages share.
#include "executor/comm/comm.h"

namespace megaplan::exec {

std::string rank_list(const std::vector<int64_t>& ranks) {
  std::string text = "[";
  for (std::size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text + "]";
}

std::string duration_text(std::chrono::milliseconds duration) {
  const int64_t ms = duration.count();
  if (ms % 60000 == 0) return std::to_string(ms / 60000) + " min";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  return std::to_string(ms) + " ms";
}

}  // namespace megaplan::exec
