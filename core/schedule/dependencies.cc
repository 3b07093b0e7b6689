// The dependency rule.
#include "core/schedule/dependencies.h"

namespace megaplan {

namespace {

// The forward input of stage s: the previous stage's forward, or a message from its rank.
void add_forward_input(const Action& action, const ScheduleShape& shape, bool lowered, std::vector<Action>& out) {
  const int64_t s = action.stage;
  if (s == 0) return;
  if (lowered && shape.rank_of_stage(s - 1) != shape.rank_of_stage(s)) {
    out.push_back(make_action(ActionKind::kRecvForward, s, action.microbatch));
  } else {
    out.push_back(forward(s - 1, action.microbatch));
  }
}

// The output gradient of stage s: the next stage's input gradient, or a message from its rank.
void add_output_gradient(const Action& action, const ScheduleShape& shape, bool lowered, std::vector<Action>& out) {
  const int64_t s = action.stage;
  if (s == shape.num_stages - 1) return;
  if (lowered && shape.rank_of_stage(s + 1) != shape.rank_of_stage(s)) {
    out.push_back(make_action(ActionKind::kRecvBackward, s, action.microbatch));
  } else {
    out.push_back(backward(s + 1, action.microbatch));
  }
}

}  // namespace

std::vector<Action> dependencies(const Action& action, const ScheduleShape& shape, bool lowered) {
  std::vector<Action> needed;
  const int64_t s = action.stage;
  const int64_t m = action.microbatch;
  switch (action.kind) {
    case ActionKind::kForward:
      add_forward_input(action, shape, lowered, needed);
      break;
    case ActionKind::kBackward:
    case ActionKind::kBackwardInput:
      needed.push_back(forward(s, m));
      add_output_gradient(action, shape, lowered, needed);
      break;
    case ActionKind::kBackwardWeight:
      needed.push_back(backward_input(s, m));
      break;
    case ActionKind::kSendForward:
      needed.push_back(forward(s, m));
      break;
    case ActionKind::kSendBackward:
      needed.push_back(backward(s, m));
      break;
    case ActionKind::kRecvForward:
      needed.push_back(make_action(ActionKind::kSendForward, message_peer_stage(action), m));
      break;
    case ActionKind::kRecvBackward:
      needed.push_back(make_action(ActionKind::kSendBackward, message_peer_stage(action), m));
      break;
    case ActionKind::kReduceGrad:
      for (int64_t microbatch = 0; microbatch < shape.microbatches; ++microbatch) {
        needed.push_back(backward_weight(s, microbatch));
      }
      break;
    case ActionKind::kOptimizer:
      break;
    case ActionKind::kOverlapForwardBackward:
      for (const Action& part : parts_of(action)) {
        for (const Action& dependency : dependencies(part, shape, lowered)) needed.push_back(dependency);
      }
      break;
  }
  return needed;
}

int64_t message_peer_stage(const Action& action) {
  const bool toward_next = action.kind == ActionKind::kSendForward || action.kind == ActionKind::kRecvBackward;
  return toward_next ? action.stage + 1 : action.stage - 1;
}

Action matching_receive(const Action& send) {
  const ActionKind kind = send.kind == ActionKind::kSendForward ? ActionKind::kRecvForward : ActionKind::kRecvBackward;
  return make_action(kind, message_peer_stage(send), send.microbatch);
}

DependencyKey dependency_key(const Action& needed) {
  const ActionKind kind = needed.kind == ActionKind::kBackward ? ActionKind::kBackwardInput : needed.kind;
  return {kind, needed.stage, needed.microbatch};
}

std::vector<DependencyKey> provided_keys(const Action& done) {
  switch (done.kind) {
    case ActionKind::kBackward:
      return {{ActionKind::kBackwardInput, done.stage, done.microbatch},
              {ActionKind::kBackwardWeight, done.stage, done.microbatch}};
    case ActionKind::kOverlapForwardBackward: {
      std::vector<DependencyKey> keys;
      for (const Action& part : parts_of(done)) {
        for (const DependencyKey& key : provided_keys(part)) keys.push_back(key);
      }
      return keys;
    }
    default:
      return {{done.kind, done.stage, done.microbatch}};
  }
}

}  // namespace megaplan
