// Action text form.
#include "core/schedule/action.h"

#include <cctype>
#include <limits>

#include "core/error.h"

namespace megaplan {

namespace {

struct KindToken {
  ActionKind kind;
  const char* token;
  bool has_microbatch;
};

// Matched as prefixes of what follows the stage number, so the one-letter "F" comes after "SEND_F".
constexpr KindToken kTokens[] = {
    {ActionKind::kReduceGrad, "REDUCE_GRAD", false},
    {ActionKind::kSendForward, "SEND_F", true},
    {ActionKind::kRecvForward, "RECV_F", true},
    {ActionKind::kSendBackward, "SEND_B", true},
    {ActionKind::kRecvBackward, "RECV_B", true},
    {ActionKind::kForward, "F", true},
    {ActionKind::kBackward, "B", true},
    {ActionKind::kBackwardInput, "I", true},
    {ActionKind::kBackwardWeight, "W", true},
};

const char* kOptimToken = "OPTIM";
const char* kOverlapToken = "OVERLAP_F_B";

bool all_digits(const std::string& text) {
  if (text.empty()) return false;
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

int64_t parse_index(const std::string& digits, const std::string& text, const std::string& field) {
  if (digits.size() > 9) throw SpecError(field, "index too large in action \"" + text + "\"");
  return std::stoll(digits);
}

}  // namespace

void throw_action_index_overflow(int64_t stage, int64_t microbatch) {
  throw SpecError("schedule", "stage " + std::to_string(stage) + " or microbatch " + std::to_string(microbatch) +
                                  " does not fit in 32 bits");
}

Action overlap_forward_backward(const Action& forward_part, const Action& backward_part) {
  Action action = forward_part;
  action.kind = ActionKind::kOverlapForwardBackward;
  action.backward_kind = backward_part.kind;
  action.backward_stage = backward_part.stage;
  action.backward_microbatch = backward_part.microbatch;
  return action;
}

std::string action_kind_token(ActionKind kind) {
  if (kind == ActionKind::kOptimizer) return kOptimToken;
  if (kind == ActionKind::kOverlapForwardBackward) return kOverlapToken;
  for (const KindToken& entry : kTokens) {
    if (entry.kind == kind) return entry.token;
  }
  return "?";
}

std::string to_string(const Action& action) {
  switch (action.kind) {
    case ActionKind::kOptimizer: return kOptimToken;
    case ActionKind::kOverlapForwardBackward: {
      const ActionParts parts = parts_of(action);
      return "(" + to_string(parts.parts[0]) + ";" + to_string(parts.parts[1]) + ")" + kOverlapToken;
    }
    case ActionKind::kReduceGrad: return std::to_string(action.stage) + action_kind_token(action.kind);
    default: return std::to_string(action.stage) + action_kind_token(action.kind) + std::to_string(action.microbatch);
  }
}

std::string to_string(const std::vector<Action>& actions) {
  std::string text;
  for (const Action& action : actions) text += (text.empty() ? "" : " ") + to_string(action);
  return text;
}

Action parse_action(const std::string& text, const std::string& field) {
  // The longest action is an overlapped pair of two of nine-digit stage and microbatch: a longer
  // cell is no action (and its text is not quoted back whole).
  constexpr std::size_t kLongestAction = 64;
  if (text.size() > kLongestAction) {
    throw SpecError(field, "an action of " + std::to_string(text.size()) + " characters (\"" + text.substr(0, 24) +
                               "...\"): an action is at most " + std::to_string(kLongestAction));
  }
  const std::string unknown = "unknown action \"" + text + "\"";
  if (text == kOptimToken) return make_action(ActionKind::kOptimizer, 0, -1);

  const std::string overlap_suffix = std::string(")") + kOverlapToken;
  if (text.starts_with("(") && text.ends_with(overlap_suffix)) {
    const std::string inner = text.substr(1, text.size() - 1 - overlap_suffix.size());
    const std::size_t separator = inner.find(';');
    if (separator == std::string::npos) throw SpecError(field, unknown + ": OVERLAP_F_B needs two actions");
    if (inner.find('(') != std::string::npos) {
      throw SpecError(field, unknown + ": OVERLAP_F_B overlaps two plain actions (no nesting)");
    }
    const Action forward_part = parse_action(inner.substr(0, separator), field);
    const Action backward_part = parse_action(inner.substr(separator + 1), field);
    if (forward_part.kind != ActionKind::kForward ||
        (backward_part.kind != ActionKind::kBackward && backward_part.kind != ActionKind::kBackwardInput)) {
      throw SpecError(field, unknown + ": OVERLAP_F_B overlaps a forward, then a backward (B or I)");
    }
    return overlap_forward_backward(forward_part, backward_part);
  }

  std::size_t digits_end = 0;
  while (digits_end < text.size() && std::isdigit(static_cast<unsigned char>(text[digits_end]))) ++digits_end;
  if (digits_end == 0) throw SpecError(field, unknown + ": expected a stage number first");
  const int64_t stage = parse_index(text.substr(0, digits_end), text, field);
  const std::string rest = text.substr(digits_end);
  for (const KindToken& entry : kTokens) {
    const std::string token = entry.token;
    if (!rest.starts_with(token)) continue;
    const std::string microbatch = rest.substr(token.size());
    if (!entry.has_microbatch) {
      if (!microbatch.empty()) throw SpecError(field, unknown + ": " + token + " takes no microbatch");
      return make_action(entry.kind, stage, -1);
    }
    if (!all_digits(microbatch)) throw SpecError(field, unknown + ": " + token + " needs a microbatch number");
    return make_action(entry.kind, stage, parse_index(microbatch, text, field));
  }
  throw SpecError(field, unknown);
}

}  // namespace megaplan
