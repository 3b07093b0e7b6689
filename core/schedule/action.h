// Action: one step of a pipeline rank's schedule — a tiny value with torch.distributed.pipelining's
// text form ("2F0", "1B3", "0SEND_F1", "1REDUCE_GRAD", "(0F3;3B1)OVERLAP_F_B"), so schedules
// round-trip with torchtitan's pipeline_parallel_schedule_csv files.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace megaplan {

enum class ActionKind : uint8_t {
  kForward,                // F
  kBackward,               // B: backward for inputs and weights together
  kBackwardInput,          // I
  kBackwardWeight,         // W
  kSendForward,            // SEND_F: activations to the next stage
  kRecvForward,            // RECV_F
  kSendBackward,           // SEND_B: gradients to the previous stage
  kRecvBackward,           // RECV_B
  kReduceGrad,             // REDUCE_GRAD: data-parallel gradient sync of one stage
  kOptimizer,              // OPTIM: the rank's optimizer step (megaplan's; torch has none)
  kOverlapForwardBackward  // OVERLAP_F_B: DualPipeV's forward of one chunk overlapped with a backward
};

// The token between stage and microbatch: "F", "SEND_F", "OVERLAP_F_B", ...
std::string action_kind_token(ActionKind kind);

// A pipeline transfer's half: SEND_F, RECV_F, SEND_B or RECV_B.
inline bool is_message(ActionKind kind) {
  return kind == ActionKind::kSendForward || kind == ActionKind::kRecvForward || kind == ActionKind::kSendBackward ||
         kind == ActionKind::kRecvBackward;
}

// A trivially copyable 20-byte value: schedules of a million actions are copied and scanned often.
// Stages and microbatches fit in 32 bits (make_action checks).
struct Action {
  ActionKind kind = ActionKind::kForward;
  ActionKind backward_kind = ActionKind::kBackward;  // OVERLAP_F_B only: B or I
  int32_t stage = 0;                                 // virtual stage; for OVERLAP_F_B its forward's; 0 for OPTIM
  int32_t microbatch = -1;                           // -1 where the kind has none (REDUCE_GRAD, OPTIM)
  int32_t backward_stage = 0;                        // OVERLAP_F_B only: the overlapped backward's stage
  int32_t backward_microbatch = -1;                  // and microbatch

  bool operator==(const Action&) const = default;
};

// Throws SpecError("schedule", ...) for a stage or microbatch that does not fit in 32 bits.
[[noreturn]] void throw_action_index_overflow(int64_t stage, int64_t microbatch);

// Constructors for generators, lowering and tests. `microbatch` is -1 for kinds without one.
// Inline: the dependency rule builds actions in every hot loop of the IR.
inline Action make_action(ActionKind kind, int64_t stage, int64_t microbatch) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (stage < -1 || stage > kMax || microbatch < -1 || microbatch > kMax)
    throw_action_index_overflow(stage, microbatch);
  Action action;
  action.kind = kind;
  action.stage = static_cast<int32_t>(stage);
  action.microbatch = static_cast<int32_t>(microbatch);
  return action;
}
inline Action forward(int64_t stage, int64_t microbatch) {
  return make_action(ActionKind::kForward, stage, microbatch);
}
inline Action backward(int64_t stage, int64_t microbatch) {
  return make_action(ActionKind::kBackward, stage, microbatch);
}
inline Action backward_input(int64_t stage, int64_t microbatch) {
  return make_action(ActionKind::kBackwardInput, stage, microbatch);
}
inline Action backward_weight(int64_t stage, int64_t microbatch) {
  return make_action(ActionKind::kBackwardWeight, stage, microbatch);
}
// DualPipeV's OVERLAP_F_B: a forward F run together with a backward (B or I) of another stage.
// REQUIRES: forward.kind == kForward, backward.kind is kBackward or kBackwardInput.
Action overlap_forward_backward(const Action& forward, const Action& backward);

// The compute parts of an action: the forward and the backward of an OVERLAP_F_B, else the
// action itself. Everything that reasons per computation (dependencies, lowering, memory) walks these.
struct ActionParts {
  std::array<Action, 2> parts;
  std::size_t count;
  const Action* begin() const { return parts.data(); }
  const Action* end() const { return parts.data() + count; }
};

inline ActionParts parts_of(const Action& action) {
  if (action.kind != ActionKind::kOverlapForwardBackward) return {{action, action}, 1};
  return {{forward(action.stage, action.microbatch),
           make_action(action.backward_kind, action.backward_stage, action.backward_microbatch)},
          2};
}

// torch's text form. OPTIM is written "OPTIM" (it belongs to the rank, not a stage).
std::string to_string(const Action& action);

// Parses the text form; throws SpecError(field, ...) naming the text for anything else, e.g.
// an unknown kind, a missing microbatch on F, or a microbatch on REDUCE_GRAD.
Action parse_action(const std::string& text, const std::string& field);

// "0F0 0F1 1B0" for messages and tests.
std::string to_string(const std::vector<Action>& actions);

}  // namespace megaplan
