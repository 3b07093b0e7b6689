// Per-rank facts by walking each rank's actions once.
#include "core/schedule/schedule_facts.h"

#include <algorithm>

#include "core/checked_math.h"

namespace megaplan {

int64_t peak_inflight_microbatches(const std::vector<Action>& actions) {
  int64_t inflight = 0;
  int64_t peak = 0;
  for (const Action& action : actions) {
    for (const Action& part : parts_of(action)) {
      if (part.kind == ActionKind::kForward) peak = std::max(peak, ++inflight);
      if (part.kind == ActionKind::kBackward || part.kind == ActionKind::kBackwardInput) --inflight;
    }
  }
  return peak;
}

std::vector<RankScheduleFacts> schedule_facts(const PipelineSchedule& schedule,
                                              const std::vector<StageActivationBytes>& stage_bytes,
                                              int64_t message_bytes) {
  std::vector<RankScheduleFacts> facts(schedule.ranks.size());
  const auto bytes_of = [&](int64_t stage) {
    return stage_bytes.empty() ? StageActivationBytes{} : stage_bytes[static_cast<std::size_t>(stage)];
  };
  for (std::size_t rank = 0; rank < schedule.ranks.size(); ++rank) {
    RankScheduleFacts& rank_facts = facts[rank];
    rank_facts.peak_inflight_microbatches = peak_inflight_microbatches(schedule.ranks[rank]);
    int64_t held = 0;
    for (const Action& action : schedule.ranks[rank]) {
      for (const Action& part : parts_of(action)) {
        switch (part.kind) {
          case ActionKind::kForward:
            ++rank_facts.compute_actions;
            held += bytes_of(part.stage).activation;
            break;
          case ActionKind::kBackward:
            ++rank_facts.compute_actions;
            held -= bytes_of(part.stage).activation;
            break;
          case ActionKind::kBackwardInput:
            ++rank_facts.compute_actions;
            held -= bytes_of(part.stage).activation - bytes_of(part.stage).weight_gradient_input;
            break;
          case ActionKind::kBackwardWeight:
            ++rank_facts.compute_actions;
            held -= bytes_of(part.stage).weight_gradient_input;
            break;
          case ActionKind::kSendForward:
          case ActionKind::kSendBackward: ++rank_facts.sends; break;
          case ActionKind::kRecvForward:
          case ActionKind::kRecvBackward: ++rank_facts.receives; break;
          default: break;
        }
        rank_facts.peak_held_bytes = std::max(rank_facts.peak_held_bytes, held);
      }
    }
    rank_facts.sent_bytes = checked_multiply(rank_facts.sends, message_bytes, "message bytes");
  }
  return facts;
}

}  // namespace megaplan
