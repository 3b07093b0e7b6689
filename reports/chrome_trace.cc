// Timeline -> Trace Event Format. Times are microseconds, as the format requires.
#include "reports/chrome_trace.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "core/action_work.h"
#include "core/error.h"
#include "core/input_limits.h"
#include "core/json_io.h"
#include "core/memory_model.h"
#include "core/pipeline_layout.h"
#include "core/version.h"
#include "reports/timeline_messages.h"

namespace megaplan {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr const char* kCollectiveCategory = "tp/cp collectives";
constexpr int kCollectiveThread = static_cast<int>(kTimelineStreamCount);  // after the streams

double gib(double bytes) { return std::round(bytes / kGiB * 1e4) / 1e4; }

// "tp all-reduce", "sp all-gather/reduce-scatter", "cp K/V ring", or both joined.
std::string collective_name(const ParallelPlan& plan) {
  std::string name;
  if (plan.tensor_parallel_size > 1) name = plan.sequence_parallel ? "sp all-gather/reduce-scatter" : "tp all-reduce";
  if (plan.context_parallel_size > 1) name += std::string(name.empty() ? "" : " + ") + "cp K/V ring";
  return name.empty() ? "collectives" : name;
}

// Each rank's memory over the iteration as counter events: its model state throughout, plus the
// activations held from each forward's start until its backward (B, or I and then W) frees them.
void add_memory_counters(const Timeline& timeline, const JobSpec& job, nlohmann::json& events) {
  const std::vector<PipelineRankMemory> memory =
      memory_per_pipeline_rank(job.model, job.plan, generate_plan_schedule(job.plan));
  const std::vector<StageActivationBytes> stages = stage_activation_bytes(job.model, job.plan);
  struct Change {
    double time;
    int64_t bytes;
  };
  std::vector<std::vector<Change>> changes(memory.size());
  const auto stage_bytes = [&](int32_t stage) -> const StageActivationBytes& {
    return stages.at(static_cast<std::size_t>(stage));
  };
  const auto add_part = [&](std::vector<Change>& rank, const Action& part, double start, double end) {
    switch (part.kind) {
      case ActionKind::kForward: rank.push_back({start, stage_bytes(part.stage).activation}); break;
      case ActionKind::kBackward: rank.push_back({end, -stage_bytes(part.stage).activation}); break;
      case ActionKind::kBackwardInput:
        rank.push_back({end, -(stage_bytes(part.stage).activation - stage_bytes(part.stage).weight_gradient_input)});
        break;
      case ActionKind::kBackwardWeight: rank.push_back({end, -stage_bytes(part.stage).weight_gradient_input}); break;
      default: break;
    }
  };
  for (const TimelineSlice& slice : timeline.slices) {
    if (slice.stream != TimelineStream::kCompute || slice.pipeline_rank < 0 ||
        static_cast<std::size_t>(slice.pipeline_rank) >= memory.size()) {
      continue;
    }
    std::vector<Change>& rank = changes[static_cast<std::size_t>(slice.pipeline_rank)];
    for (const Action& part : parts_of(slice.action)) add_part(rank, part, slice.start_s, slice.end_s);
  }
  for (std::size_t rank = 0; rank < memory.size(); ++rank) {
    const PipelineRankMemory& held = memory[rank];
    const double state = static_cast<double>(held.weight_bytes + held.gradient_bytes + held.optimizer_bytes +
                                             held.runtime_reserve_bytes);
    std::vector<Change>& list = changes[rank];
    std::stable_sort(list.begin(), list.end(), [](const Change& a, const Change& b) { return a.time < b.time; });
    const auto counter = [&](double time, int64_t activations) {
      events.push_back(
          {{"name", "memory"},
           {"ph", "C"},
           {"ts", time * 1e6},
           {"pid", rank},
           {"args", {{"model state GiB", gib(state)}, {"activations GiB", gib(static_cast<double>(activations))}}}});
    };
    int64_t activations = 0;
    counter(0, 0);
    for (std::size_t i = 0; i < list.size(); ++i) {
      activations += list[i].bytes;
      if (i + 1 == list.size() || list[i + 1].time != list[i].time) counter(list[i].time, activations);
    }
  }
}

// Each layer's share of a compute slice's collectives: two slices per layer, after the attention
// (the middle of the layer's share of the slice) and after the MLP (its end).
void add_collective_detail(const TimelineSlice& slice, const JobSpec& job, const std::string& name,
                           nlohmann::json& events) {
  if (slice.collective_s <= 0 || slice.action.kind == ActionKind::kOptimizer) return;
  const StageLayers held = stage_layers(slice.action.stage, job.model, job.plan);
  const int64_t layers = std::max<int64_t>(held.num_layers, 1);
  const double window = (slice.end_s - slice.start_s) / static_cast<double>(layers);
  const double each = slice.collective_s / static_cast<double>(2 * layers);
  for (int64_t layer = 0; layer < layers; ++layer) {
    const double layer_start = slice.start_s + static_cast<double>(layer) * window;
    for (const double end : {layer_start + window / 2, layer_start + window}) {
      events.push_back({{"name", name},
                        {"cat", kCollectiveCategory},
                        {"ph", "X"},
                        {"ts", (end - each) * 1e6},
                        {"dur", each * 1e6},
                        {"pid", slice.pipeline_rank},
                        {"tid", kCollectiveThread},
                        {"args", {{"action", to_string(slice.action)}, {"layer", held.first_layer + layer}}}});
    }
  }
}

// The trace of `timeline`; `job`, where given, names each slice's layers and work and the run.
nlohmann::json chrome_trace(const Timeline& timeline, const JobSpec* job, bool collective_detail) {
  require_at_most(static_cast<int64_t>(timeline.slices.size()), kMaxTraceActions,
                  "the trace's actions (every pipeline rank's; fewer microbatches or stages make fewer)");
  nlohmann::json events = nlohmann::json::array();
  std::set<std::pair<int32_t, int>> tracks;
  std::vector<const TimelineSlice*> slices;
  slices.reserve(timeline.slices.size());
  std::vector<StageWork> work;
  if (job) work = stage_work(job->model, job->plan);
  const std::string collectives = job ? collective_name(job->plan) : "";
  for (const TimelineSlice& slice : timeline.slices) {
    slices.push_back(&slice);
    tracks.insert({slice.pipeline_rank, static_cast<int>(slice.stream)});
    const Action& action = slice.action;
    nlohmann::json args = {{"virtual_stage", action.stage}};
    if (action.microbatch >= 0) args["microbatch"] = action.microbatch;
    if (job && action.kind != ActionKind::kOptimizer && action.stage < job->plan.num_virtual_stages()) {
      const StageLayers layers = stage_layers(action.stage, job->model, job->plan);
      args["layers"] =
          std::to_string(layers.first_layer) + "-" + std::to_string(layers.first_layer + layers.num_layers - 1);
      const ActionWork done = action_work(work, action);
      if (done.flops > 0) args["flops"] = done.flops;
      if (done.bytes > 0) args["bytes"] = done.bytes;
    }
    events.push_back({{"name", to_string(action)},
                      {"cat", to_string(slice.stream)},
                      {"ph", "X"},
                      {"ts", slice.start_s * 1e6},
                      {"dur", (slice.end_s - slice.start_s) * 1e6},
                      {"pid", slice.pipeline_rank},
                      {"tid", static_cast<int>(slice.stream)},
                      {"args", std::move(args)}});
    if (job && collective_detail && slice.collective_s > 0) {
      add_collective_detail(slice, *job, collectives, events);
      tracks.insert({slice.pipeline_rank, kCollectiveThread});
    }
  }
  // Flow arrows: from each send to the receive it pairs with.
  int64_t flow = 0;
  for (const auto& [send, receive] : message_pairs(slices)) {
    const TimelineSlice& slice = *slices[send];
    const TimelineSlice& to = *slices[receive];
    events.push_back({{"name", "message"},
                      {"cat", "pipeline"},
                      {"ph", "s"},
                      {"id", flow},
                      {"ts", slice.start_s * 1e6},
                      {"pid", slice.pipeline_rank},
                      {"tid", static_cast<int>(slice.stream)}});
    events.push_back({{"name", "message"},
                      {"cat", "pipeline"},
                      {"ph", "f"},
                      {"bp", "e"},
                      {"id", flow},
                      {"ts", to.start_s * 1e6},
                      {"pid", to.pipeline_rank},
                      {"tid", static_cast<int>(to.stream)}});
    ++flow;
  }
  if (job) add_memory_counters(timeline, *job, events);
  // Names for the tracks: "pipeline rank 3" / "compute".
  std::set<int32_t> ranks;
  for (const auto& [rank, thread] : tracks) {
    if (ranks.insert(rank).second) {
      events.push_back({{"name", "process_name"},
                        {"ph", "M"},
                        {"pid", rank},
                        {"args", {{"name", "pipeline rank " + std::to_string(rank)}}}});
    }
    const std::string name =
        thread == kCollectiveThread ? kCollectiveCategory : to_string(static_cast<TimelineStream>(thread));
    events.push_back(
        {{"name", "thread_name"}, {"ph", "M"}, {"pid", rank}, {"tid", thread}, {"args", {{"name", name}}}});
  }
  nlohmann::json metadata = {{"source", timeline.source}, {"megaplan", kVersion}};
  if (job) {
    metadata["model"] = job->model.name;
    metadata["plan"] = describe_plan(job->plan);
    metadata["identity"] = trace_identity(*job);
  }
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}, {"otherData", std::move(metadata)}};
}

}  // namespace

nlohmann::json timeline_to_chrome_trace(const Timeline& timeline) { return chrome_trace(timeline, nullptr, false); }

nlohmann::json timeline_to_chrome_trace(const Timeline& timeline, const JobSpec& job, bool collective_detail) {
  return chrome_trace(timeline, &job, collective_detail);
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

nlohmann::json trace_identity(const JobSpec& job) {
  nlohmann::json model = model_spec_to_json(job.model);
  model.erase("name");
  nlohmann::json plan = parallel_plan_to_json(job.plan);
  for (const char* key : {"implementation", "implementation_options", "moe_imbalance"}) plan.erase(key);
  return {{"model_spec", std::move(model)}, {"parallel_plan", std::move(plan)}};
}

void check_trace_identity(const Timeline& timeline, const nlohmann::json& expected, const std::string& flag,
                          const std::string& other) {
  if (timeline.identity.is_null() || expected.is_null()) return;
  if (const std::optional<std::string> difference = first_json_difference(timeline.identity, expected)) {
    throw SpecError(flag, timeline.source + " is a trace of another run than " + other + ": " + *difference);
  }
}

Timeline timeline_from_chrome_trace(const nlohmann::json& trace, const std::string& file) {
  if (!trace.is_object() || !trace.contains("traceEvents") || !trace.at("traceEvents").is_array()) {
    throw SpecError(file, "not a Chrome trace: no \"traceEvents\" array");
  }
  Timeline timeline;
  timeline.source = file;
  if (const auto metadata = trace.find("otherData"); metadata != trace.end() && metadata->is_object()) {
    if (const auto identity = metadata->find("identity"); identity != metadata->end()) {
      if (!identity->is_object()) throw SpecError(file + ": otherData: identity", "must be an object");
      timeline.identity = *identity;
    }
  }
  const nlohmann::json& events = trace.at("traceEvents");
  for (std::size_t i = 0; i < events.size(); ++i) {
    const nlohmann::json& event = events[i];
    const std::string where = file + ": traceEvents[" + std::to_string(i) + "]";
    if (!event.is_object()) throw SpecError(where, "must be an object");
    if (field_of<std::string>(event, "ph", where) != "X") continue;  // track names, counters, flows
    const auto category = event.find("cat");
    if (category != event.end() && *category == kCollectiveCategory) continue;  // --trace-detail's
    TimelineSlice slice;
    slice.action = parse_action(field_of<std::string>(event, "name", where), where + ": name");
    const int64_t rank = field_of<int64_t>(event, "pid", where);
    if (rank < 0 || rank > std::numeric_limits<int32_t>::max())
      throw SpecError(where + ": pid", "must be a pipeline rank >= 0");
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
