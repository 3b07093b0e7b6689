#include "reports/search_tables.h"

#include <cmath>

#include "reports/text_table.h"
#include "core/units.h"

namespace megaplan {

namespace {

// "even", "emb+loss" (the embedding and the loss counted as layers), "first 7 last 7".
std::string split_cell(const PipelineSplit& split) {
  if (split.even()) return "even";
  if (split.account_for_embedding || split.account_for_loss) {
    return std::string(split.account_for_embedding ? "emb" : "") + (split.account_for_embedding && split.account_for_loss ? "+" : "") +
           (split.account_for_loss ? "loss" : "");
  }
  return describe_pipeline_split(split);
}

}  // namespace

std::string ranked_plans_table(const std::vector<RankedPlan>& plans, std::optional<double> best_s,
                               std::optional<int64_t> memory_limit_bytes) {
  std::vector<std::string> header = {"#", "tp", "pp", "dp", "cp", "vpp", "split", "mbs", "recompute", "sp", "dist-opt",
                                     "schedule", "iteration s", "TFLOP/s/GPU", "MFU", "peak memory", "vs #1"};
  if (memory_limit_bytes) header.push_back("fits");
  TextTable table(std::move(header));
  if (plans.empty()) return table.render();
  const double best = best_s.value_or(plans.front().estimate.iteration_time_s);
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const RankedPlan& ranked = plans[i];
    const ParallelPlan& plan = ranked.plan;
    std::vector<std::string> row = {std::to_string(i + 1), std::to_string(plan.tensor_parallel_size),
                   std::to_string(plan.pipeline_parallel_size), std::to_string(plan.data_parallel_size),
                   std::to_string(plan.context_parallel_size), std::to_string(plan.virtual_pipeline_parallel_size),
                   split_cell(plan.pipeline_split),
                   std::to_string(plan.micro_batch_size), to_string(plan.recompute_granularity),
                   plan.sequence_parallel ? "on" : "off", plan.use_distributed_optimizer ? "on" : "off",
                   to_string(plan.schedule), format_fixed(ranked.estimate.iteration_time_s, 3),
                   format_fixed(ranked.estimate.model_tflops_per_gpu, 1), format_percent(ranked.estimate.mfu),
                   format_gib(static_cast<double>(ranked.peak_memory_bytes)),
                   i == 0 && !best_s ? ""
                                     : format_percent(ranked.estimate.iteration_time_s / best - 1, true) +
                                           (ranked.tie ? " tie" : "")};
    if (memory_limit_bytes) row.push_back(ranked.peak_memory_bytes <= *memory_limit_bytes ? "yes" : "no");
    table.add_row(std::move(row));
  }
  return table.render();
}

std::string winner_explanation(const std::vector<RankedPlan>& plans, int64_t memory_limit_bytes) {
  if (plans.size() < 2) return "Only one plan fits: nothing to compare it with.\n";
  const RankedPlan& first = plans[0];
  const RankedPlan& second = plans[1];
  const StepEstimate& a = first.estimate;
  const StepEstimate& b = second.estimate;
  std::string text = "Why #1 beats #2 by " + format_fixed(b.iteration_time_s - a.iteration_time_s, 4) +
                     " s per iteration (mean seconds per pipeline rank):\n";
  text += "  #1: " + describe_plan(first.plan) + "\n  #2: " + describe_plan(second.plan) + "\n";
  TextTable table({"term", "#1 s", "#2 s", "#2 - #1"});
  struct Term {
    const char* name;
    double first;
    double second;
  };
  const Term terms[] = {{"compute", a.compute_s, b.compute_s},
                        {"tp/cp communication", a.tensor_comm_s, b.tensor_comm_s},
                        {"pp communication", a.pipeline_comm_s, b.pipeline_comm_s},
                        {"dp communication", a.data_parallel_comm_s, b.data_parallel_comm_s},
                        {"idle (bubble, tail)", a.idle_s, b.idle_s}};
  const Term* largest = &terms[0];
  for (const Term& term : terms) {
    table.add_row({term.name, format_fixed(term.first, 4), format_fixed(term.second, 4),
                   format_fixed(term.second - term.first, 4)});
    if (std::abs(term.second - term.first) > std::abs(largest->second - largest->first)) largest = &term;
  }
  table.add_row({"iteration", format_fixed(a.iteration_time_s, 4), format_fixed(b.iteration_time_s, 4),
                 format_fixed(b.iteration_time_s - a.iteration_time_s, 4)});
  const auto headroom = [&](const RankedPlan& plan) {
    return format_gib(static_cast<double>(memory_limit_bytes - plan.peak_memory_bytes));
  };
  table.add_row({"memory headroom", headroom(first), headroom(second), ""});
  text += table.render();
  text += "The largest difference is " + std::string(largest->name) + " (" +
          format_fixed(largest->second - largest->first, 4) + " s); bubble " + format_percent(a.bubble_fraction) +
          " against " + format_percent(b.bubble_fraction) + ".\n";
  return text;
}

}  // namespace megaplan
