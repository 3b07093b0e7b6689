#include "reports/search_tables.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "core/text_table.h"
#include "core/units.h"

namespace megaplan {

namespace {

// "even", "emb+loss" (the embedding and the loss counted as layers), "first 7 last 7".
std::string split_cell(const PipelineSplit& split) {
  if (split.even()) return "even";
  if (split.account_for_embedding || split.account_for_loss) {
    return std::string(split.account_for_embedding ? "emb" : "") +
           (split.account_for_embedding && split.account_for_loss ? "+" : "") + (split.account_for_loss ? "loss" : "");
  }
  return describe_pipeline_split(split);
}

// The values a switch takes over a row's plans, in rank order: "on", "off" or "off/on".
std::string switch_cell(const std::vector<const ParallelPlan*>& members, bool ParallelPlan::*member) {
  std::string cell;
  bool seen[2] = {false, false};
  for (const ParallelPlan* plan : members) {
    const bool value = plan->*member;
    if (seen[value]) continue;
    seen[value] = true;
    cell += (cell.empty() ? "" : "/") + std::string(value ? "on" : "off");
  }
  return cell;
}

// Plans in rank order gathered into rows: each row's plans differ only in their switches, each
// within `within` of the row's first (fastest) plan.
std::vector<std::vector<std::size_t>> table_rows(const std::vector<RankedPlan>& plans, std::optional<double> within) {
  std::vector<std::vector<std::size_t>> rows;
  for (std::size_t i = 0; i < plans.size(); ++i) {
    bool joined = false;
    for (std::size_t r = 0; within && r < rows.size() && !joined; ++r) {
      const RankedPlan& first = plans[rows[r].front()];
      if (!structurally_different(first.plan, plans[i].plan) &&
          plans[i].estimate.iteration_time_s <= first.estimate.iteration_time_s * (1 + *within)) {
        rows[r].push_back(i);
        joined = true;
      }
    }
    if (!joined) rows.push_back({i});
  }
  return rows;
}

}  // namespace

bool structurally_different(const ParallelPlan& a, const ParallelPlan& b) {
  ParallelPlan switched = b;
  switched.sequence_parallel = a.sequence_parallel;
  switched.use_distributed_optimizer = a.use_distributed_optimizer;
  const auto key = [](const ParallelPlan& plan) {
    return std::tuple(
        plan.tensor_parallel_size, plan.pipeline_parallel_size, plan.context_parallel_size, plan.data_parallel_size,
        plan.virtual_pipeline_parallel_size, plan.micro_batch_size, plan.global_batch_size, plan.sequence_parallel,
        plan.use_distributed_optimizer, plan.recompute_granularity, plan.schedule, plan.recompute_method,
        plan.recompute_num_layers, plan.pipeline_split.first_stage_layers, plan.pipeline_split.last_stage_layers,
        plan.pipeline_split.account_for_embedding, plan.pipeline_split.account_for_loss, plan.implementation,
        plan.expert_model_parallel_size, plan.expert_tensor_parallel(), plan.moe_imbalance);
  };
  return key(a) != key(switched) || !(a.options == switched.options);
}

std::string ranked_plans_table(const std::vector<RankedPlan>& plans, std::optional<double> best_s,
                               std::optional<int64_t> memory_limit_bytes, std::optional<double> collapse_within) {
  std::vector<std::string> header = {"#",           "tp",          "pp",        "dp",          "cp",       "vpp",
                                     "split",       "mbs",         "recompute", "sp",          "dist-opt", "schedule",
                                     "iteration s", "TFLOP/s/GPU", "MFU",       "peak memory", "vs #1"};
  // A model with experts: its plans' ep after cp, and their experts' tensor-parallel size where one
  // differs from tp.
  const bool experts = std::any_of(plans.begin(), plans.end(),
                                   [](const RankedPlan& ranked) { return ranked.plan.expert_groups_apart(); });
  const bool cut = std::any_of(plans.begin(), plans.end(), [](const RankedPlan& ranked) {
    return ranked.plan.expert_tensor_parallel() != ranked.plan.tensor_parallel_size;
  });
  const std::size_t ep_column = 5;
  if (experts) header.insert(header.begin() + ep_column, "ep");
  if (cut) header.insert(header.begin() + ep_column + 1, "etp");
  if (memory_limit_bytes) header.push_back("fits");
  TextTable table(std::move(header));
  if (plans.empty()) return table.render();
  const double best = best_s.value_or(plans.front().estimate.iteration_time_s);
  for (const std::vector<std::size_t>& members : table_rows(plans, collapse_within)) {
    const std::size_t i = members.front();
    const RankedPlan& ranked = plans[i];
    const ParallelPlan& plan = ranked.plan;
    std::string ranks;
    std::vector<const ParallelPlan*> variants;
    for (const std::size_t member : members) {
      ranks += (ranks.empty() ? "" : ",") + std::to_string(member + 1);
      variants.push_back(&plans[member].plan);
    }
    std::vector<std::string> row = {
        ranks,
        std::to_string(plan.tensor_parallel_size),
        std::to_string(plan.pipeline_parallel_size),
        std::to_string(plan.data_parallel_size),
        std::to_string(plan.context_parallel_size),
        std::to_string(plan.virtual_pipeline_parallel_size),
        split_cell(plan.pipeline_split),
        std::to_string(plan.micro_batch_size),
        to_string(plan.recompute_granularity),
        switch_cell(variants, &ParallelPlan::sequence_parallel),
        switch_cell(variants, &ParallelPlan::use_distributed_optimizer),
        to_string(plan.schedule),
        format_fixed(ranked.estimate.iteration_time_s, 3),
        format_fixed(ranked.estimate.model_tflops_per_gpu, 1),
        format_percent(ranked.estimate.mfu),
        format_gib(static_cast<double>(ranked.peak_memory_bytes)),
        i == 0 && !best_s
            ? ""
            : format_percent(ranked.estimate.iteration_time_s / best - 1, true) + (ranked.tie ? " tie" : "")};
    if (experts) row.insert(row.begin() + ep_column, std::to_string(plan.expert_model_parallel_size));
    if (cut) row.insert(row.begin() + ep_column + 1, std::to_string(plan.expert_tensor_parallel()));
    if (memory_limit_bytes) row.push_back(ranked.peak_memory_bytes <= *memory_limit_bytes ? "yes" : "no");
    table.add_row(std::move(row));
  }
  return table.render();
}

std::string winner_explanation(const std::vector<RankedPlan>& plans, int64_t memory_limit_bytes) {
  if (plans.size() < 2) return "Only one plan fits: nothing to compare it with.\n";
  const RankedPlan& first = plans[0];
  // Another layout, not #1 with a switch flipped, which would differ by little but the switch.
  std::size_t other = 1;
  while (other < plans.size() && !structurally_different(first.plan, plans[other].plan)) ++other;
  if (other == plans.size()) other = 1;
  const RankedPlan& second = plans[other];
  const std::string name = "#" + std::to_string(other + 1);
  const StepEstimate& a = first.estimate;
  const StepEstimate& b = second.estimate;
  std::string text = "Why #1 beats " + name + (other > 1 ? " (the best other layout)" : "") + " by " +
                     format_fixed(b.iteration_time_s - a.iteration_time_s, 4) +
                     " s per iteration (mean seconds per pipeline rank):\n";
  text += "  #1: " + describe_plan(first.plan) + "\n  " + name + ": " + describe_plan(second.plan) + "\n";
  TextTable table({"term", "#1 s", name + " s", name + " - #1"});
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
