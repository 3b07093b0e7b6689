// Timeline: what each pipeline rank's streams did and when. The simulator produces one; the
// executor will record one in the same form, so the two lay side by side slice for slice.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/schedule/action.h"

namespace megaplan {

// The streams of one pipeline rank, as stream_of assigns actions to them.
enum class TimelineStream : uint8_t { kCompute, kSend, kReceive, kDataParallel };
inline constexpr std::size_t kTimelineStreamCount = 4;
static_assert(kTimelineStreamCount == static_cast<std::size_t>(TimelineStream::kDataParallel) + 1);
std::string to_string(TimelineStream stream);  // "compute", "send", "receive", "data-parallel"

// The stream an action runs on, one rule for the simulator and the executor: compute runs F, B, I,
// W, OVERLAP_F_B and OPTIM; SEND_F and SEND_B the send stream and RECV_F and RECV_B the receive
// stream, so a rank can send while it waits to receive; REDUCE_GRAD the data-parallel stream, so
// gradient reduction overlaps the backwards still to run.
// Inline: the simulator's event loop asks it once per event and must inline it.
constexpr TimelineStream stream_of(ActionKind kind) {
  switch (kind) {
    case ActionKind::kSendForward:
    case ActionKind::kSendBackward: return TimelineStream::kSend;
    case ActionKind::kRecvForward:
    case ActionKind::kRecvBackward: return TimelineStream::kReceive;
    case ActionKind::kReduceGrad: return TimelineStream::kDataParallel;
    case ActionKind::kForward:
    case ActionKind::kBackward:
    case ActionKind::kBackwardInput:
    case ActionKind::kBackwardWeight:
    case ActionKind::kOptimizer:
    case ActionKind::kOverlapForwardBackward: return TimelineStream::kCompute;
  }
  return TimelineStream::kCompute;  // not reached: every kind is listed, and -Wswitch says when one is not
}

struct TimelineSlice {
  int32_t pipeline_rank = 0;
  TimelineStream stream = TimelineStream::kCompute;
  Action action;  // the slice's name is to_string(action)
  double start_s = 0;
  double end_s = 0;
  // The part of a compute slice spent in tensor- and context-parallel collectives inside its layers,
  // where the simulator knows it (0 in measured timelines): --trace-detail draws it.
  double collective_s = 0;
};

struct Timeline {
  std::string source;  // "simulated" or what measured it
  std::vector<TimelineSlice> slices;
  // What a trace read back records of the run it is a timeline of (reports/chrome_trace.h's
  // trace_identity); null where it records nothing.
  nlohmann::json identity;
};

}  // namespace megaplan
