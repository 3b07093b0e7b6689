#include "reports/timeline_messages.h"

#include <map>
#include <tuple>

#include "core/schedule/dependencies.h"

namespace megaplan {

std::vector<std::pair<std::size_t, std::size_t>> message_pairs(const std::vector<const TimelineSlice*>& slices) {
  std::map<std::tuple<ActionKind, int32_t, int32_t>, std::size_t> receives;  // (kind, stage, microbatch)
  for (std::size_t i = 0; i < slices.size(); ++i) {
    const Action& action = slices[i]->action;
    if (action.kind == ActionKind::kRecvForward || action.kind == ActionKind::kRecvBackward) {
      receives.emplace(std::tuple(action.kind, action.stage, action.microbatch), i);
    }
  }
  std::vector<std::pair<std::size_t, std::size_t>> pairs;
  for (std::size_t i = 0; i < slices.size(); ++i) {
    const Action& action = slices[i]->action;
    if (action.kind != ActionKind::kSendForward && action.kind != ActionKind::kSendBackward) continue;
    const Action receive = matching_receive(action);
    const auto found = receives.find(std::tuple(receive.kind, receive.stage, receive.microbatch));
    if (found != receives.end()) pairs.emplace_back(i, found->second);
  }
  return pairs;
}

}  // namespace megaplan
