// What a schedule implies per pipeline rank, read off its action lists: activation memory held and
// messages sent. The memory model and the simulator take these from the schedule itself, so a new
// schedule (or an imported CSV) needs no formula of its own.
#pragma once

#include <cstdint>
#include <vector>

#include "core/schedule/schedule.h"

namespace megaplan {

// Bytes one microbatch leaves on a stage: `activation` from its forward until its input gradient
// (B or I); `weight_gradient_input` from I until W (what W still needs after I freed the rest).
struct StageActivationBytes {
  int64_t activation = 0;
  int64_t weight_gradient_input = 0;
};

// The most microbatches whose activations a rank holds at once: forwards (F, or the forward of an
// OVERLAP_F_B) not yet followed by their backward (B or I) on the same stage.
int64_t peak_inflight_microbatches(const std::vector<Action>& actions);

struct RankScheduleFacts {
  int64_t compute_actions = 0;             // F, B, I, W (an OVERLAP_F_B counts its two parts)
  int64_t peak_inflight_microbatches = 0;  // forwards whose B or I has not run yet, at most
  int64_t peak_held_bytes = 0;             // activation bytes held at most, by StageActivationBytes
  int64_t sends = 0;                       // SEND_F and SEND_B
  int64_t receives = 0;                    // RECV_F and RECV_B
  int64_t sent_bytes = 0;                  // sends * message_bytes
};

// `stage_bytes[s]` for every stage s (or empty: bytes come out 0); `message_bytes` is one
// point-to-point message (an activation or its gradient). Messages count only once lowered.
// REQUIRES: stage_bytes is empty or has shape.num_stages entries.
std::vector<RankScheduleFacts> schedule_facts(const PipelineSchedule& schedule,
                                              const std::vector<StageActivationBytes>& stage_bytes = {},
                                              int64_t message_bytes = 0);

}  // namespace megaplan
