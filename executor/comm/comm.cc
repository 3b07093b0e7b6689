// The words every Comm implementation's error messages share, requests joined into one, and the
// checks all_to_all's implementations share.
#include "executor/comm/comm.h"

#include <stdexcept>
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

Request all_of(std::vector<Request> requests) {
  if (requests.empty()) throw std::invalid_argument("all_of: no requests");
  Request all = std::move(requests.front());
  for (std::size_t i = 1; i < requests.size(); ++i) all = both(std::move(all), std::move(requests[i]));
  return all;
}

void check_segment_counts(const std::vector<std::size_t>& counts, int64_t members, const std::string& group,
                          const char* which) {
  if (static_cast<int64_t>(counts.size()) != members) {
    throw std::invalid_argument("all_to_all on " + group + ": " + which + " has " + std::to_string(counts.size()) +
                                " entries for " + std::to_string(members) + " members");
  }
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
