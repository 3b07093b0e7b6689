// The one dependency rule of the schedule IR: what must have happened before an action may run.
// Lowering, validation, the simulator and the executor all ask this function; none re-derives it.
#pragma once

#include <vector>

#include "core/schedule/schedule.h"

namespace megaplan {

// The actions `action` waits for, on any rank (program order on its own rank is implied and not
// listed). A listed backward(s, m) means "the input gradient of stage s, microbatch m", which a
// B or an I provides; a listed backward_weight(s, m) means "the weight gradient", which a B or a W
// provides (see provides()).
//   F(s,m)      <- F(s-1,m) on the same rank, else RECV_F(s,m) (lowered) or F(s-1,m) (unlowered)
//   B/I(s,m)    <- F(s,m); input gradient of s+1 as F's rule, with RECV_B(s,m)
//   W(s,m)      <- I(s,m)
//   SEND_F(s,m) <- F(s,m);          RECV_F(s,m) <- SEND_F(s-1,m)
//   SEND_B(s,m) <- B/I(s,m);        RECV_B(s,m) <- SEND_B(s+1,m)
//   REDUCE_GRAD(s) <- the weight gradient of s for every microbatch
//   OPTIM       <- nothing beyond program order (it must be its rank's last action)
//   OVERLAP_F_B <- what its forward and its backward wait for
std::vector<Action> dependencies(const Action& action, const ScheduleShape& shape, bool lowered);

// The stage at the other end of a send or receive: SEND_F(s) and RECV_B(s) talk to stage s+1,
// RECV_F(s) and SEND_B(s) to stage s-1. REQUIRES: action is a SEND_* or RECV_*.
int64_t message_peer_stage(const Action& action);

// The receive a send pairs with, the inverse of the receive rule above:
// SEND_F(s,m) -> RECV_F(s+1,m), SEND_B(s,m) -> RECV_B(s-1,m). REQUIRES: action is a SEND_*.
Action matching_receive(const Action& send);

// Dependencies and what actions provide, compared as keys: a needed backward or backward_input
// is the input gradient (kind kBackwardInput); backward_weight is the weight gradient.
struct DependencyKey {
  ActionKind kind = ActionKind::kForward;
  int64_t stage = 0;
  int64_t microbatch = -1;
  auto operator<=>(const DependencyKey&) const = default;
};
DependencyKey dependency_key(const Action& needed);

// Numbers every key of a shape densely (0 .. size()-1), so lowering and validation can use arrays
// instead of ordered maps: a pp 64, vpp 4, M 1024 schedule holds about a million keys.
class DependencyKeyIndex {
 public:
  explicit DependencyKeyIndex(const ScheduleShape& shape)
      : stages_(static_cast<std::size_t>(shape.num_stages)), microbatch_slots_(static_cast<std::size_t>(shape.microbatches) + 1) {}
  std::size_t size() const { return kKinds * stages_ * microbatch_slots_; }
  // REQUIRES: the key's stage and microbatch (or -1) lie within the shape.
  std::size_t operator()(const DependencyKey& key) const {
    return (static_cast<std::size_t>(key.kind) * stages_ + static_cast<std::size_t>(key.stage)) * microbatch_slots_ +
           static_cast<std::size_t>(key.microbatch + 1);
  }

 private:
  static constexpr std::size_t kKinds = static_cast<std::size_t>(ActionKind::kOverlapForwardBackward) + 1;
  std::size_t stages_;
  std::size_t microbatch_slots_;
};
// What running `done` makes available: B both gradients, I the input gradient, W the weight
// gradient, the parts of an OVERLAP_F_B, and every other action itself.
std::vector<DependencyKey> provided_keys(const Action& done);

}  // namespace megaplan
