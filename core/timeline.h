// Timeline: what each pipeline rank's streams did and when. The simulator produces one; the
// executor will record one in the same form, so the two lay side by side slice for slice.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/schedule/action.h"

namespace megaplan {

// Compute runs F/B/I/W/OVERLAP_F_B and OPTIM; sends and receives have a stream each; the
// data-parallel stream runs REDUCE_GRAD.
enum class TimelineStream : uint8_t { kCompute, kSend, kReceive, kDataParallel };
std::string to_string(TimelineStream stream);  // "compute", "send", "receive", "data-parallel"

struct TimelineSlice {
  int32_t pipeline_rank = 0;
  TimelineStream stream = TimelineStream::kCompute;
  Action action;  // the slice's name is to_string(action)
  double start_s = 0;
  double end_s = 0;
};

struct Timeline {
  std::string source;  // "simulated" or what measured it
  std::vector<TimelineSlice> slices;
};

}  // namespace megaplan
