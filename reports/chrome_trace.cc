// Timeline -> Trace Event Format. Times are microseconds, as the format requires.
#include "reports/chrome_trace.h"

#include <set>

namespace megaplan {

nlohmann::json timeline_to_chrome_trace(const Timeline& timeline) {
  nlohmann::json events = nlohmann::json::array();
  std::set<std::pair<int32_t, TimelineStream>> tracks;
  for (const TimelineSlice& slice : timeline.slices) {
    tracks.insert({slice.pipeline_rank, slice.stream});
    events.push_back({{"name", to_string(slice.action)},
                      {"cat", to_string(slice.stream)},
                      {"ph", "X"},
                      {"ts", slice.start_s * 1e6},
                      {"dur", (slice.end_s - slice.start_s) * 1e6},
                      {"pid", slice.pipeline_rank},
                      {"tid", static_cast<int>(slice.stream)}});
  }
  // Names for the tracks: "pipeline rank 3" / "compute".
  std::set<int32_t> ranks;
  for (const auto& [rank, stream] : tracks) {
    if (ranks.insert(rank).second) {
      events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank},
                        {"args", {{"name", "pipeline rank " + std::to_string(rank)}}}});
    }
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank}, {"tid", static_cast<int>(stream)},
                      {"args", {{"name", to_string(stream)}}}});
  }
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}, {"otherData", {{"source", timeline.source}}}};
}

}  // namespace megaplan
