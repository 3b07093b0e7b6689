// The words every Comm implementation's error messages share, and a pair of requests as one.
#include "executor/comm/comm.h"

#include <utility>

namespace megaplan::exec {

namespace {

class BothRequests final : public CommRequest {
 public:
  BothRequests(Request first, Request second) : first_(std::move(first)), second_(std::move(second)) {}
  void wait() override {
    first_->wait();
    second_->wait();
  }

 private:
  Request first_, second_;
};

}  // namespace

Request both(Request first, Request second) {
  return std::make_unique<BothRequests>(std::move(first), std::move(second));
}

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
