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
// Calls `visit(const Action& needed)` for each dependency, in the order dependencies() lists them,
// without allocating: lowering, validation and the simulator call it once or more per action.
template <typename Visit>
void for_each_dependency(const Action& action, const ScheduleShape& shape, bool lowered, Visit&& visit);

std::vector<Action> dependencies(const Action& action, const ScheduleShape& shape, bool lowered);

namespace detail {

// The dependency rule only derives actions from a valid one (a neighbouring stage, the same
// microbatch), which always fit: no range check in its hot path.
inline Action derived_action(ActionKind kind, int64_t stage, int64_t microbatch) {
  Action action;
  action.kind = kind;
  action.stage = static_cast<int32_t>(stage);
  action.microbatch = static_cast<int32_t>(microbatch);
  return action;
}

}  // namespace detail

// The stage at the other end of a send or receive: SEND_F(s) and RECV_B(s) talk to stage s+1,
// RECV_F(s) and SEND_B(s) to stage s-1. REQUIRES: action is a SEND_* or RECV_*.
inline int64_t message_peer_stage(const Action& action) {
  const bool toward_next = action.kind == ActionKind::kSendForward || action.kind == ActionKind::kRecvBackward;
  return toward_next ? action.stage + 1 : action.stage - 1;
}

// The receive a send pairs with, the inverse of the receive rule above:
// SEND_F(s,m) -> RECV_F(s+1,m), SEND_B(s,m) -> RECV_B(s-1,m).
// REQUIRES: action is a SEND_* whose peer stage lies within the shape (it is not range-checked).
inline Action matching_receive(const Action& send) {
  const ActionKind kind = send.kind == ActionKind::kSendForward ? ActionKind::kRecvForward : ActionKind::kRecvBackward;
  return detail::derived_action(kind, message_peer_stage(send), send.microbatch);
}

// The send a receive pairs with, the receive rule itself: RECV_F(s,m) -> SEND_F(s-1,m),
// RECV_B(s,m) -> SEND_B(s+1,m).
// REQUIRES: action is a RECV_* whose peer stage lies within the shape (it is not range-checked).
inline Action matching_send(const Action& receive) {
  const ActionKind kind =
      receive.kind == ActionKind::kRecvForward ? ActionKind::kSendForward : ActionKind::kSendBackward;
  return detail::derived_action(kind, message_peer_stage(receive), receive.microbatch);
}

// Dependencies and what actions provide, compared as keys: a needed backward or backward_input
// is the input gradient (kind kBackwardInput); backward_weight is the weight gradient.
struct DependencyKey {
  ActionKind kind = ActionKind::kForward;
  int64_t stage = 0;
  int64_t microbatch = -1;
  auto operator<=>(const DependencyKey&) const = default;
};
inline DependencyKey dependency_key(const Action& needed) {
  const ActionKind kind = needed.kind == ActionKind::kBackward ? ActionKind::kBackwardInput : needed.kind;
  return {kind, needed.stage, needed.microbatch};
}

// Numbers every key of a shape densely (0 .. size()-1), so lowering and validation can use arrays
// instead of ordered maps: a pp 64, vpp 4, M 1024 schedule holds about a million keys.
class DependencyKeyIndex {
 public:
  explicit DependencyKeyIndex(const ScheduleShape& shape)
      : stages_(static_cast<std::size_t>(shape.num_stages)),
        microbatch_slots_(static_cast<std::size_t>(shape.microbatches) + 1) {}
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
// One bit per key of a DependencyKeyIndex: a million keys fit in cache, and unlike
// std::vector<bool> the index arithmetic is unsigned shifts.
class KeyFlags {
 public:
  explicit KeyFlags(std::size_t size) : words_((size + 63) / 64, 0) {}
  bool test(std::size_t key) const { return (words_[key >> 6] >> (key & 63)) & 1u; }
  void set(std::size_t key) { words_[key >> 6] |= uint64_t{1} << (key & 63); }

 private:
  std::vector<uint64_t> words_;
};

// What running `done` makes available: B both gradients, I the input gradient, W the weight
// gradient, the parts of an OVERLAP_F_B, and every other action itself.
std::vector<DependencyKey> provided_keys(const Action& done);
// The same, as calls to `visit(const DependencyKey&)`, without allocating.
template <typename Visit>
void for_each_provided_key(const Action& done, Visit&& visit);

// --- implementation of the templates above ---------------------------------------------------

namespace detail {

// The forward input of stage s: the previous stage's forward, or a message from its rank.
template <typename Visit>
void visit_forward_input(const Action& action, const ScheduleShape& shape, bool lowered, Visit& visit) {
  const int64_t s = action.stage;
  if (s == 0) return;
  if (lowered && !shape.next_stage_on_same_rank(s - 1)) {
    visit(derived_action(ActionKind::kRecvForward, s, action.microbatch));
  } else {
    visit(derived_action(ActionKind::kForward, s - 1, action.microbatch));
  }
}

// The output gradient of stage s: the next stage's input gradient, or a message from its rank.
template <typename Visit>
void visit_output_gradient(const Action& action, const ScheduleShape& shape, bool lowered, Visit& visit) {
  const int64_t s = action.stage;
  if (s == shape.num_stages - 1) return;
  if (lowered && !shape.next_stage_on_same_rank(s)) {
    visit(derived_action(ActionKind::kRecvBackward, s, action.microbatch));
  } else {
    visit(derived_action(ActionKind::kBackward, s + 1, action.microbatch));
  }
}

}  // namespace detail

namespace detail {

// One computation or message (not an OVERLAP_F_B): kept free of recursion so it inlines.
template <typename Visit>
void visit_dependencies(const Action& action, const ScheduleShape& shape, bool lowered, Visit& visit) {
  const int64_t s = action.stage;
  const int64_t m = action.microbatch;
  switch (action.kind) {
    case ActionKind::kForward: visit_forward_input(action, shape, lowered, visit); break;
    case ActionKind::kBackward:
    case ActionKind::kBackwardInput:
      visit(derived_action(ActionKind::kForward, s, m));
      visit_output_gradient(action, shape, lowered, visit);
      break;
    case ActionKind::kBackwardWeight: visit(derived_action(ActionKind::kBackwardInput, s, m)); break;
    case ActionKind::kSendForward: visit(derived_action(ActionKind::kForward, s, m)); break;
    case ActionKind::kSendBackward: visit(derived_action(ActionKind::kBackward, s, m)); break;
    case ActionKind::kRecvForward:
    case ActionKind::kRecvBackward: visit(matching_send(action)); break;
    case ActionKind::kReduceGrad:
      for (int64_t microbatch = 0; microbatch < shape.microbatches; ++microbatch)
        visit(derived_action(ActionKind::kBackwardWeight, s, microbatch));
      break;
    case ActionKind::kOptimizer:
    case ActionKind::kOverlapForwardBackward: break;
  }
}

template <typename Visit>
void visit_provided_keys(const Action& done, Visit& visit) {
  if (done.kind == ActionKind::kBackward) {
    visit(DependencyKey{ActionKind::kBackwardInput, done.stage, done.microbatch});
    visit(DependencyKey{ActionKind::kBackwardWeight, done.stage, done.microbatch});
  } else {
    visit(DependencyKey{done.kind, done.stage, done.microbatch});
  }
}

}  // namespace detail

template <typename Visit>
void for_each_dependency(const Action& action, const ScheduleShape& shape, bool lowered, Visit&& visit) {
  if (action.kind != ActionKind::kOverlapForwardBackward) {
    detail::visit_dependencies(action, shape, lowered, visit);
    return;
  }
  for (const Action& part : parts_of(action)) detail::visit_dependencies(part, shape, lowered, visit);
}

template <typename Visit>
void for_each_provided_key(const Action& done, Visit&& visit) {
  if (done.kind != ActionKind::kOverlapForwardBackward) {
    detail::visit_provided_keys(done, visit);
    return;
  }
  for (const Action& part : parts_of(done)) detail::visit_provided_keys(part, visit);
}

}  // namespace megaplan
