#include "reports/html_report.h"

#include <algorithm>
#include <cmath>
#include <string_view>
#include <tuple>

#include "core/action_work.h"
#include "core/error.h"
#include "core/json_io.h"
#include "core/pipeline_layout.h"
#include "core/version.h"
#include "planner/launch_commands.h"
#include "planner/megatron_arguments.h"
#include "reports/report_assets.h"
#include "reports/search_provenance.h"
#include "reports/search_report.h"
#include "reports/timeline_comparison.h"
#include "reports/timeline_messages.h"
#include "simulator/profile_choice.h"

namespace megaplan {

namespace {

// The order of timeline.kinds in the page: an action kind's index.
constexpr ActionKind kKinds[] = {
    ActionKind::kForward,     ActionKind::kBackward,    ActionKind::kBackwardInput,         ActionKind::kBackwardWeight,
    ActionKind::kSendForward, ActionKind::kRecvForward, ActionKind::kSendBackward,          ActionKind::kRecvBackward,
    ActionKind::kReduceGrad,  ActionKind::kOptimizer,   ActionKind::kOverlapForwardBackward};

int kind_index(ActionKind kind) {
  return static_cast<int>(std::find(std::begin(kKinds), std::end(kKinds), kind) - std::begin(kKinds));
}

// Seconds to 10 ns: every action lasts far longer, and shorter numbers keep a report of a million
// slices small.
double rounded(double seconds) { return std::round(seconds * 1e8) / 1e8; }

nlohmann::json summary_json(const PlanReport& report) {
  const JobSpec& job = report.job;
  const ParallelPlan& plan = job.plan;
  const double tokens = static_cast<double>(plan.global_batch_size * job.model.seq_length);
  return {{"model", job.model.name},
          {"cluster", job.cluster.name},
          {"gpu", job.cluster.gpu.name},
          {"gpus", plan.world_size()},
          {"plan",
           {{"tp", plan.tensor_parallel_size},
            {"pp", plan.pipeline_parallel_size},
            {"cp", plan.context_parallel_size},
            {"dp", plan.data_parallel_size},
            {"vpp", plan.virtual_pipeline_parallel_size},
            {"mbs", plan.micro_batch_size},
            {"gbs", plan.global_batch_size},
            {"microbatches", plan.num_microbatches()},
            {"schedule", to_string(plan.schedule)},
            {"sequence_parallel", plan.sequence_parallel},
            {"distributed_optimizer", plan.use_distributed_optimizer},
            {"recompute", to_string(plan.recompute_granularity)},
            {"implementation", to_string(plan.implementation)}}},
          {"iteration_time_s", report.iteration_time_s},
          {"tokens_per_s", report.iteration_time_s > 0 ? tokens / report.iteration_time_s : 0.0},
          {"model_tflops_per_gpu", report.model_tflops_per_gpu},
          {"mfu", report.mfu},
          {"bubble_fraction", report.bubble_fraction},
          {"peak_memory_bytes", report.peak_memory_bytes},
          {"memory_capacity_bytes", report.memory_capacity_bytes},
          {"fits_in_memory", report.fits_in_memory},
          {"profile",
           {{"name", report.profile_name},
            {"kind", report.profile_kind},
            {"description", report.profile_description},
            {"uncertainty", report.profile_uncertainty}}},
          {"megatron_arguments", report.megatron_arguments},
          {"launch", report.launch}};
}

nlohmann::json memory_json(const PlanReport& report) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const PipelineRankMemory& rank : report.memory) {
    const std::pair<const char*, int64_t> parts[] = {{"weights", rank.weight_bytes},
                                                     {"gradients", rank.gradient_bytes},
                                                     {"optimizer state", rank.optimizer_bytes},
                                                     {"activations", rank.activation_bytes},
                                                     {"logits and transient", rank.transient_bytes},
                                                     {"allocator overhead", rank.allocator_overhead_bytes},
                                                     {"runtime reserve", rank.runtime_reserve_bytes}};
    nlohmann::json list = nlohmann::json::array();
    for (const auto& [name, bytes] : parts) list.push_back({{"name", name}, {"bytes", bytes}});
    ranks.push_back({{"rank", rank.pipeline_rank},
                     {"total_bytes", rank.total_bytes},
                     {"inflight_microbatches", rank.peak_inflight_microbatches},
                     {"parts", std::move(list)}});
  }
  return {{"capacity_bytes", report.memory_capacity_bytes}, {"ranks", std::move(ranks)}};
}

// A timeline of `job` as the page draws it; `iteration_s` bounds its span from below.
nlohmann::json timeline_json(const Timeline& timeline, const JobSpec& job, double iteration_s) {
  // Rows: each (pipeline rank, stream) with slices, in rank then stream order.
  std::vector<const TimelineSlice*> slices;
  slices.reserve(timeline.slices.size());
  for (const TimelineSlice& slice : timeline.slices) slices.push_back(&slice);
  std::stable_sort(slices.begin(), slices.end(), [](const TimelineSlice* a, const TimelineSlice* b) {
    return std::tuple(a->pipeline_rank, a->stream, a->start_s) < std::tuple(b->pipeline_rank, b->stream, b->start_s);
  });
  nlohmann::json rows = nlohmann::json::array();
  nlohmann::json compact = nlohmann::json::array();
  std::pair<int32_t, TimelineStream> row_key{-1, TimelineStream::kCompute};
  double span = 0;
  for (std::size_t i = 0; i < slices.size(); ++i) {
    const TimelineSlice& slice = *slices[i];
    if (std::pair(slice.pipeline_rank, slice.stream) != row_key) {
      row_key = {slice.pipeline_rank, slice.stream};
      rows.push_back({{"rank", slice.pipeline_rank}, {"stream", to_string(slice.stream)}});
    }
    const Action& action = slice.action;
    compact.push_back({rows.size() - 1, rounded(slice.start_s), rounded(slice.end_s - slice.start_s),
                       kind_index(action.kind), action.stage, action.microbatch});
    span = std::max(span, slice.end_s);
  }
  nlohmann::json arrows = nlohmann::json::array();
  for (const auto& [send, receive] : message_pairs(slices)) arrows.push_back({send, receive});
  nlohmann::json layers = nlohmann::json::array();
  for (int64_t stage = 0; stage < job.plan.num_virtual_stages(); ++stage) {
    const StageLayers held = stage_layers(stage, job.model, job.plan);
    layers.push_back({held.first_layer, held.first_layer + held.num_layers - 1});
  }
  nlohmann::json work = nlohmann::json::array();
  for (const StageWork& stage : stage_work(job.model, job.plan)) {
    work.push_back({{"F", stage.forward_flops},
                    {"B", stage.backward_flops},
                    {"I", stage.backward_input_flops},
                    {"W", stage.backward_weight_flops},
                    {"message_bytes", stage.message_bytes},
                    {"gradient_bytes", stage.gradient_bytes}});
  }
  nlohmann::json kinds = nlohmann::json::array();
  for (const ActionKind kind : kKinds) kinds.push_back(action_kind_token(kind));
  return {{"span_s", std::max(span, iteration_s)},
          {"source", timeline.source.empty() ? "simulated" : timeline.source},
          {"rows", std::move(rows)},
          {"kinds", std::move(kinds)},
          {"slices", std::move(compact)},
          {"layers", std::move(layers)},
          {"work", std::move(work)},
          {"arrows", std::move(arrows)}};
}

// A plan of `search --json` as the alternatives section lists it.
// `where` names it in errors ("search.json: plans[3]"); `rank` is its place in the ranking.
nlohmann::json alternative_json(const nlohmann::json& plan, const std::string& where, const nlohmann::json& rank,
                                const ParallelPlan& chosen) {
  JsonFieldReader reader(plan, where);
  int64_t tp = 0, pp = 0, cp = 0, dp = 0, vpp = 0, mbs = 0, peak = 0;
  double iteration = 0, compute = 0, tensor = 0, pipeline = 0, data_parallel = 0, idle = 0;
  bool fits = true, tie = false, sequence_parallel = false, distributed_optimizer = false;
  std::string schedule, recompute;
  reader.require("tensor_parallel_size", tp);
  reader.require("pipeline_parallel_size", pp);
  reader.require("context_parallel_size", cp);
  reader.require("data_parallel_size", dp);
  reader.require("virtual_pipeline_parallel_size", vpp);
  reader.require("micro_batch_size", mbs);
  reader.require("schedule", schedule);
  reader.require("recompute_granularity", recompute);
  reader.require("iteration_time_s", iteration);
  reader.require("peak_memory_bytes", peak);
  reader.require("fits_in_memory", fits);
  reader.read("tie_with_best", tie);
  reader.require("compute_s", compute);
  reader.require("tensor_comm_s", tensor);
  reader.require("pipeline_comm_s", pipeline);
  reader.require("data_parallel_comm_s", data_parallel);
  reader.require("idle_s", idle);
  reader.read("sequence_parallel", sequence_parallel);
  reader.read("use_distributed_optimizer", distributed_optimizer);
  // A model with experts: ep, and etp where it is not tp (plan JSON writes them only then).
  int64_t ep = 1, etp = 0;
  reader.read("expert_model_parallel_size", ep);
  reader.read("expert_tensor_parallel_size", etp);
  const int64_t experts_cut = etp > 0 ? etp : tp;
  // The switches named too: plans that differ only in them would otherwise read alike.
  const std::string label = "tp " + std::to_string(tp) + " pp " + std::to_string(pp) + " cp " + std::to_string(cp) +
                            " dp " + std::to_string(dp) + (ep > 1 ? " ep " + std::to_string(ep) : "") +
                            (experts_cut != tp ? " etp " + std::to_string(experts_cut) : "") +
                            (vpp > 1 ? " vpp " + std::to_string(vpp) : "") + " mbs " + std::to_string(mbs) + " " +
                            schedule + (recompute == "none" ? "" : " " + recompute) + (sequence_parallel ? " sp" : "") +
                            (distributed_optimizer ? " dist-opt" : "");
  const bool same = tp == chosen.tensor_parallel_size && pp == chosen.pipeline_parallel_size &&
                    cp == chosen.context_parallel_size && dp == chosen.data_parallel_size &&
                    ep == chosen.expert_model_parallel_size && experts_cut == chosen.expert_tensor_parallel() &&
                    vpp == chosen.virtual_pipeline_parallel_size && mbs == chosen.micro_batch_size &&
                    schedule == to_string(chosen.schedule) && recompute == to_string(chosen.recompute_granularity) &&
                    sequence_parallel == chosen.sequence_parallel &&
                    distributed_optimizer == chosen.use_distributed_optimizer;
  return {{"rank", rank},
          {"label", label},
          {"iteration_time_s", iteration},
          {"fits", fits},
          {"tie", tie},
          {"peak_memory_bytes", peak},
          {"chosen", same},
          {"terms",
           {{"compute", compute},
            {"exposed tp/cp", tensor},
            {"pp transfers", pipeline},
            {"dp", data_parallel},
            {"idle", idle}}}};
}

nlohmann::json alternatives_json(const PlanReport& report) {
  if (!report.search) return nullptr;
  const nlohmann::json& search = *report.search;
  const std::string& source = report.search_source;
  if (!search.is_object() || !search.contains("plans") || !search.at("plans").is_array()) {
    throw SpecError("--search", source + ": plans: must be the array `megaplan search --json` writes");
  }
  nlohmann::json plans = nlohmann::json::array();
  for (std::size_t i = 0; i < search.at("plans").size(); ++i) {
    plans.push_back(
        alternative_json(search.at("plans")[i], source + ": plans[" + std::to_string(i) + "]", i + 1, report.job.plan));
  }
  // Faster layouts the memory limit refused: shown, marked, after the ranking.
  if (search.contains("over_memory")) {
    const nlohmann::json& over = search.at("over_memory");
    if (!over.is_array()) throw SpecError("--search", source + ": over_memory: must be an array");
    for (std::size_t i = 0; i < over.size(); ++i) {
      nlohmann::json plan =
          alternative_json(over[i], source + ": over_memory[" + std::to_string(i) + "]", "over", report.job.plan);
      plan["fits"] = false;
      plans.push_back(std::move(plan));
    }
  }
  // Once its plans read as a search's: alternatives of this plan's model and cluster, not another's,
  // each a plan the planner could have ranked there.
  check_search_provenance(search, source, report.job);
  for (const char* list : {"plans", "over_memory"}) {
    if (!search.contains(list)) continue;
    for (std::size_t i = 0; i < search.at(list).size(); ++i) {
      (void)read_search_plan(search.at(list)[i], source + ": " + list + "[" + std::to_string(i) + "]", report.job.model,
                             report.job.cluster.total_gpus());
    }
  }
  double uncertainty = 0;
  if (search.contains("tie_tolerance") && search.at("tie_tolerance").is_number()) {
    uncertainty = search.at("tie_tolerance").get<double>();
  }
  return {{"uncertainty", uncertainty}, {"plans", std::move(plans)}};
}

nlohmann::json measured_json(const PlanReport& report) {
  if (!report.measured) return nullptr;
  const TimelineComparison comparison = compare_timelines(report.timeline, *report.measured);
  nlohmann::json residuals = nlohmann::json::array();
  nlohmann::json ranks = nlohmann::json::array();
  bool same_order = true;
  for (const RankComparison& rank : comparison.ranks) {
    for (const KindComparison& kind : rank.kinds) {
      residuals.push_back({{"rank", rank.pipeline_rank},
                           {"action", action_kind_token(kind.kind)},
                           {"count", kind.count},
                           {"simulated_s", kind.simulated_s},
                           {"measured_s", kind.measured_s},
                           {"error", relative_error(kind.simulated_s, kind.measured_s)}});
    }
    ranks.push_back({{"rank", rank.pipeline_rank},
                     {"simulated_span_s", rank.simulated_span_s},
                     {"measured_span_s", rank.measured_span_s},
                     {"same_order", rank.same_compute_order}});
    same_order = same_order && rank.same_compute_order;
  }
  Timeline measured = *report.measured;
  measured.source = "measured: " + report.measured_source;
  return {{"source", measured.source},
          {"iteration_time_s", comparison.measured_iteration_s},
          {"simulated_iteration_time_s", comparison.simulated_iteration_s},
          {"error", relative_error(comparison.simulated_iteration_s, comparison.measured_iteration_s)},
          {"same_order", same_order},
          {"residuals", std::move(residuals)},
          {"ranks", std::move(ranks)},
          {"timeline", timeline_json(measured, report.job, comparison.measured_iteration_s)}};
}

// Replaces the line holding exactly `placeholder` (whitespace around it allowed) by `content`.
void replace_placeholder(std::string& page, std::string_view placeholder, const std::string& content) {
  const std::size_t at = page.find(placeholder);
  if (at == std::string::npos) throw std::logic_error("the report template lacks " + std::string(placeholder));
  page.replace(at, placeholder.size(), content);
}

}  // namespace

nlohmann::json report_data(const PlanReport& report) {
  const JobSpec& job = report.job;
  return {{"title", job.model.name + " on " + std::to_string(job.plan.world_size()) + " x " + job.cluster.gpu.name},
          {"megaplan_version", kVersion},
          {"summary", summary_json(report)},
          {"memory", memory_json(report)},
          {"alternatives", alternatives_json(report)},
          {"timeline", timeline_json(report.timeline, job, report.iteration_time_s)},
          {"measured", measured_json(report)}};
}

std::string render_html_report(const nlohmann::json& data) {
  std::string page(report_template_html());
  // "</" inside a script element would end it early: JSON strings carry it as "<\/".
  std::string json = data.dump();
  for (std::size_t at = json.find("</"); at != std::string::npos; at = json.find("</", at + 3))
    json.insert(at + 1, "\\");
  replace_placeholder(page, "/*MEGAPLAN_D3*/", std::string(d3_min_js()));
  replace_placeholder(page, "/*MEGAPLAN_DATA*/", "window.MEGAPLAN = " + json + ";");
  return page;
}

PlanReport plan_report(const JobSpec& job, const sim::Profile& profile, sim::PlanSimulation simulation) {
  PlanReport report;
  report.job = job;
  report.iteration_time_s = simulation.result.iteration_time_s;
  report.model_tflops_per_gpu = simulation.rates.model_tflops_per_gpu;
  report.mfu = simulation.rates.mfu;
  report.bubble_fraction = simulation.result.bubble_fraction;
  report.peak_memory_bytes = simulation.peak_memory_bytes;
  report.memory_capacity_bytes = simulation.memory_capacity_bytes;
  report.fits_in_memory = simulation.fits_in_memory;
  report.memory = std::move(simulation.memory);
  report.timeline = std::move(simulation.result.timeline);
  report.profile_name = profile.gpu_name();
  report.profile_kind = sim::to_string(profile.kind());
  report.profile_description = sim::describe_profile(profile);
  report.profile_uncertainty = profile.uncertainty();
  report.megatron_arguments = planner::format_megatron_arguments(planner::megatron_arguments(job.model, job.plan));
  report.launch = planner::format_launch_commands(
      planner::launch_commands(job.plan, job.cluster, "job.json", "--data-path DATA_PREFIX --train-iters ITERS"));
  return report;
}

}  // namespace megaplan
