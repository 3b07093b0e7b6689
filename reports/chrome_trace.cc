// Timeline -> Trace Event Format. Times are microseconds, as the format requires.
#include "reports/chrome_trace.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/pipeline_layout.h"
#include "core/version.h"
#include "reports/timeline_messages.h"

namespace megaplan {

namespace {

// The trace of `timeline`; `job`, where given, names each slice's layers and the run.
nlohmann::json chrome_trace(const Timeline& timeline, const JobSpec* job) {
  nlohmann::json events = nlohmann::json::array();
  std::set<std::pair<int32_t, TimelineStream>> tracks;
  std::vector<const TimelineSlice*> slices;
  slices.reserve(timeline.slices.size());
  for (const TimelineSlice& slice : timeline.slices) {
    slices.push_back(&slice);
    tracks.insert({slice.pipeline_rank, slice.stream});
    const Action& action = slice.action;
    nlohmann::json args = {{"virtual_stage", action.stage}};
    if (action.microbatch >= 0) args["microbatch"] = action.microbatch;
    if (job && action.kind != ActionKind::kOptimizer && action.stage < job->plan.num_virtual_stages()) {
      const StageLayers layers = stage_layers(action.stage, job->model, job->plan);
      args["layers"] = std::to_string(layers.first_layer) + "-" + std::to_string(layers.first_layer + layers.num_layers - 1);
    }
    events.push_back({{"name", to_string(action)},
                      {"cat", to_string(slice.stream)},
                      {"ph", "X"},
                      {"ts", slice.start_s * 1e6},
                      {"dur", (slice.end_s - slice.start_s) * 1e6},
                      {"pid", slice.pipeline_rank},
                      {"tid", static_cast<int>(slice.stream)},
                      {"args", std::move(args)}});
  }
  // Flow arrows: from each send to the receive it pairs with.
  int64_t flow = 0;
  for (const auto& [send, receive] : message_pairs(slices)) {
    const TimelineSlice& slice = *slices[send];
    const TimelineSlice& to = *slices[receive];
    events.push_back({{"name", "message"}, {"cat", "pipeline"}, {"ph", "s"}, {"id", flow}, {"ts", slice.start_s * 1e6},
                      {"pid", slice.pipeline_rank}, {"tid", static_cast<int>(slice.stream)}});
    events.push_back({{"name", "message"}, {"cat", "pipeline"}, {"ph", "f"}, {"bp", "e"}, {"id", flow},
                      {"ts", to.start_s * 1e6}, {"pid", to.pipeline_rank}, {"tid", static_cast<int>(to.stream)}});
    ++flow;
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
  nlohmann::json metadata = {{"source", timeline.source}, {"megaplan", kVersion}};
  if (job) {
    const ParallelPlan& plan = job->plan;
    metadata["model"] = job->model.name;
    metadata["plan"] = "tp " + std::to_string(plan.tensor_parallel_size) + ", pp " +
                       std::to_string(plan.pipeline_parallel_size) + ", cp " + std::to_string(plan.context_parallel_size) +
                       ", dp " + std::to_string(plan.data_parallel_size) + ", vpp " +
                       std::to_string(plan.virtual_pipeline_parallel_size) + ", mbs " +
                       std::to_string(plan.micro_batch_size) + ", gbs " + std::to_string(plan.global_batch_size) + ", " +
                       to_string(plan.schedule);
  }
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}, {"otherData", std::move(metadata)}};
}

}  // namespace

nlohmann::json timeline_to_chrome_trace(const Timeline& timeline) { return chrome_trace(timeline, nullptr); }

nlohmann::json timeline_to_chrome_trace(const Timeline& timeline, const JobSpec& job) {
  return chrome_trace(timeline, &job);
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
