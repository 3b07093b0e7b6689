#include "reports/search_report.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "core/implementation_options.h"
#include "core/units.h"
#include "reports/search_provenance.h"
#include "reports/search_tables.h"
#include "simulator/profile_choice.h"

namespace megaplan {
namespace {

nlohmann::json plan_json(const RankedPlan& ranked, int64_t memory_limit) {
  nlohmann::json json = parallel_plan_to_json(ranked.plan);
  const StepEstimate& estimate = ranked.estimate;
  json["num_microbatches"] = ranked.plan.num_microbatches();
  json["iteration_time_s"] = estimate.iteration_time_s;
  json["model_tflops_per_gpu"] = estimate.model_tflops_per_gpu;
  json["mfu"] = estimate.mfu;
  json["bubble_fraction"] = estimate.bubble_fraction;
  json["peak_memory_bytes"] = ranked.peak_memory_bytes;
  json["fits_in_memory"] = ranked.peak_memory_bytes <= memory_limit;
  json["lower_bound_s"] = ranked.lower_bound_s;
  json["tie_with_best"] = ranked.tie;
  json["compute_s"] = estimate.compute_s;
  json["tensor_comm_s"] = estimate.tensor_comm_s;
  json["pipeline_comm_s"] = estimate.pipeline_comm_s;
  json["data_parallel_comm_s"] = estimate.data_parallel_comm_s;
  json["idle_s"] = estimate.idle_s;
  return json;
}

// The measures plan_json adds to the plan's own fields: whether a simulation gives each above
// zero (a time, memory, a count) or at least zero, and the most it may be (MFU and the bubble are
// fractions).
struct Measure {
  const char* key;
  bool positive;
  double most;
};
constexpr double kUnbounded = std::numeric_limits<double>::max();
constexpr Measure kMeasures[] = {{"num_microbatches", true, kUnbounded},
                                 {"iteration_time_s", true, kUnbounded},
                                 {"model_tflops_per_gpu", false, kUnbounded},
                                 {"mfu", false, 1.0},
                                 {"bubble_fraction", false, 1.0},
                                 {"peak_memory_bytes", true, kUnbounded},
                                 {"lower_bound_s", false, kUnbounded},
                                 {"compute_s", false, kUnbounded},
                                 {"tensor_comm_s", false, kUnbounded},
                                 {"pipeline_comm_s", false, kUnbounded},
                                 {"data_parallel_comm_s", false, kUnbounded},
                                 {"idle_s", false, kUnbounded}};

// 1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, ..., 21st.
std::string ordinal(int64_t n) {
  const int64_t tens = n % 100;
  const char* suffix = (tens >= 11 && tens <= 13) ? "th"
                       : n % 10 == 1              ? "st"
                       : n % 10 == 2              ? "nd"
                       : n % 10 == 3              ? "rd"
                                                  : "th";
  return std::to_string(n) + suffix;
}

// The ranking: the plans that fit, then those faster but over the memory limit.
void write_ranking(const SearchRun& run, const planner::SearchResult& result, bool compare, std::ostream& out) {
  const JobSpec& job = run.job;
  const planner::SearchCounts& counts = result.counts;
  if (compare) {
    out << job.model.name << " on " << job.cluster.total_gpus() << " x " << job.cluster.gpu.name << ", gbs "
        << run.global_batch_size << ", seq " << job.model.seq_length << ": " << counts.enumerated
        << " layouts compared, fitting or not (memory limit "
        << format_gib(static_cast<double>(result.memory_limit_bytes)) << " per GPU); " << format_fixed(run.seconds, 3)
        << " s\n\n"
        << ranked_plans_table(result.plans, std::nullopt, result.memory_limit_bytes);
    return;
  }
  out << job.model.name << " on " << job.cluster.total_gpus() << " x " << job.cluster.gpu.name << ", gbs "
      << run.global_batch_size << ", seq " << job.model.seq_length << ", memory limit "
      << format_gib(static_cast<double>(result.memory_limit_bytes)) << " per GPU\n";
  out << counts.enumerated << " plans: " << counts.pruned_model_state << " over the limit on model state alone, "
      << counts.pruned_activations << " with activations, " << counts.pruned_by_bound << " cannot beat the "
      << ordinal(run.top) << " best (lower bound); " << counts.simulated << " simulated; "
      << format_fixed(run.seconds, 3) << " s on " << run.threads << " threads ("
      << format_count(static_cast<double>(counts.enumerated) / std::max(run.seconds, 1e-9)) << " plans/s)\n\n";
  // Plans that differ only in a switch and that the profile cannot tell apart share a row.
  out << ranked_plans_table(result.plans, std::nullopt, std::nullopt, run.profile.uncertainty());
  if (!result.over_memory.empty()) {
    out << "\nfaster, but over the memory limit (" << format_gib(static_cast<double>(result.memory_limit_bytes))
        << "):\n"
        << ranked_plans_table(result.over_memory, result.plans.front().estimate.iteration_time_s);
  }
}

}  // namespace

nlohmann::json search_json(const SearchRun& run, const planner::SearchResult& result,
                           const planner::SearchSpace& space) {
  nlohmann::json plans = nlohmann::json::array();
  for (const RankedPlan& ranked : result.plans) plans.push_back(plan_json(ranked, result.memory_limit_bytes));
  nlohmann::json over_memory = nlohmann::json::array();
  for (const RankedPlan& ranked : result.over_memory)
    over_memory.push_back(plan_json(ranked, result.memory_limit_bytes));
  nlohmann::json json = {{"plans", std::move(plans)},
                         {"over_memory", std::move(over_memory)},
                         {"counts",
                          {{"enumerated", result.counts.enumerated},
                           {"pruned_model_state", result.counts.pruned_model_state},
                           {"pruned_activations", result.counts.pruned_activations},
                           {"pruned_by_bound", result.counts.pruned_by_bound},
                           {"simulated", result.counts.simulated}}},
                         {"memory_limit_bytes", result.memory_limit_bytes},
                         {"profile", sim::profile_json(run.profile)},
                         {"tie_tolerance", run.profile.uncertainty()},
                         {"seconds", run.seconds},
                         {"threads", run.threads}};
  // What was searched, so that `report --search` can refuse a search of another model or cluster.
  json.update(search_provenance(run.job.model, run.job.cluster, space.implementation, space.options));
  return json;
}

void write_search_text(const SearchRun& run, const planner::SearchResult& result, const SearchTextOptions& options,
                       std::ostream& out) {
  write_ranking(run, result, options.compare, out);
  const double uncertainty = run.profile.uncertainty();
  out << "code (" << options.picked << "): " << describe_implementation(run.job.plan) << "\n";
  out << "profile: " << sim::describe_profile(run.profile) << "\n";
  out << (uncertainty > 0 ? "ties: plans marked \"tie\" are predicted within the profile's stated uncertainty (" +
                                format_percent(uncertainty) + ") of #1; the simulator cannot rank them apart\n"
                          : std::string("ties: the profile states no uncertainty, so no plan is marked as a tie\n"));
  if (options.explain) out << "\n" << winner_explanation(result.plans, result.memory_limit_bytes);
}

ParallelPlan read_search_plan(const nlohmann::json& entry, const std::string& where, const ModelSpec& model,
                              int64_t gpus) {
  const auto refuse = [&](const std::string& rule) { throw SpecError("--search", where + ": " + rule); };
  if (!entry.is_object()) refuse("must be an object, as `megaplan search --json` writes each plan");
  nlohmann::json fields = entry;
  for (const char* flag : {"fits_in_memory", "tie_with_best"}) {
    if (fields.contains(flag) && !fields.at(flag).is_boolean()) refuse(std::string(flag) + ": must be true or false");
    fields.erase(flag);
  }
  for (const Measure& measure : kMeasures) {
    const auto found = fields.find(measure.key);
    if (found == fields.end()) continue;
    const bool positive = measure.positive;
    const double value = found->is_number() ? found->get<double>() : std::nan("");
    if (!std::isfinite(value) || value < 0 || (positive && value == 0) || value > measure.most) {
      refuse(std::string(measure.key) + ": must be a finite number " + (positive ? "> 0" : ">= 0") +
             (measure.most < kUnbounded ? " and at most " + format_significant(measure.most, 3) : "") + ", got " +
             found->dump());
    }
    fields.erase(found);
  }
  ParallelPlan plan;
  try {
    plan = parallel_plan_from_json(fields, where);
    // The world first, where the sizes make one (validate_plan refuses the rest): it says most.
    int64_t world = 1;
    bool sized = true;
    for (const int64_t size : {plan.tensor_parallel_size, plan.pipeline_parallel_size, plan.context_parallel_size,
                               plan.data_parallel_size}) {
      sized = sized && size > 0 && !__builtin_mul_overflow(world, size, &world);
    }
    if (sized && world != gpus) {
      refuse("tp x pp x cp x dp is " + std::to_string(world) + " GPUs, but the search was of " + std::to_string(gpus));
    }
    validate_plan(model, plan);
  } catch (const SpecError& error) {
    if (error.field() == "--search") throw;
    const std::string message = error.what();  // the reader's name `where` and the key already
    if (message.rfind(where, 0) == 0) throw SpecError("--search", message);
    refuse(message);
  }
  return plan;
}

}  // namespace megaplan
