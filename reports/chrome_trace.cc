// Timeline -> Trace Event Format. Times are microseconds, as the format requires.
#include "reports/chrome_trace.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>

#include "core/error.h"

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

namespace {

// event.at(key) as T, or SpecError naming the field.
template <typename T>
T field_of(const nlohmann::json& event, const char* key, const std::string& where) {
  const auto found = event.find(key);
  if (found == event.end()) throw SpecError(where + ": " + key, "missing");
  try {
    return found->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw SpecError(where + ": " + key, "has the wrong type: " + found->dump());
  }
}

double seconds_of(const nlohmann::json& event, const char* key, const std::string& where) {
  const double microseconds = field_of<double>(event, key, where);
  if (!std::isfinite(microseconds) || microseconds < 0) {
    throw SpecError(where + ": " + key, "must be a finite number >= 0 (microseconds), got " + event.at(key).dump());
  }
  return microseconds * 1e-6;
}

}  // namespace

Timeline timeline_from_chrome_trace(const nlohmann::json& trace, const std::string& file) {
  if (!trace.is_object() || !trace.contains("traceEvents") || !trace.at("traceEvents").is_array()) {
    throw SpecError(file, "not a Chrome trace: no \"traceEvents\" array");
  }
  Timeline timeline;
  timeline.source = file;
  const nlohmann::json& events = trace.at("traceEvents");
  for (std::size_t i = 0; i < events.size(); ++i) {
    const nlohmann::json& event = events[i];
    const std::string where = file + ": traceEvents[" + std::to_string(i) + "]";
    if (!event.is_object()) throw SpecError(where, "must be an object");
    if (field_of<std::string>(event, "ph", where) != "X") continue;  // track names and other metadata
    TimelineSlice slice;
    slice.action = parse_action(field_of<std::string>(event, "name", where), where + ": name");
    const int64_t rank = field_of<int64_t>(event, "pid", where);
    if (rank < 0 || rank > std::numeric_limits<int32_t>::max()) throw SpecError(where + ": pid", "must be a pipeline rank >= 0");
    slice.pipeline_rank = static_cast<int32_t>(rank);
    slice.stream = stream_of(slice.action.kind);
    const int64_t thread = field_of<int64_t>(event, "tid", where);
    if (thread != static_cast<int64_t>(slice.stream)) {
      throw SpecError(where + ": tid", "is " + std::to_string(thread) + ", but " + to_string(slice.action) +
                                           " runs on the " + to_string(slice.stream) + " stream (" +
                                           std::to_string(static_cast<int>(slice.stream)) + ")");
    }
    slice.start_s = seconds_of(event, "ts", where);
    slice.end_s = slice.start_s + seconds_of(event, "dur", where);
    timeline.slices.push_back(slice);
  }
  return timeline;
}

}  // namespace megaplan
