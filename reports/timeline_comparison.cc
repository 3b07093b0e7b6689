#include "reports/timeline_comparison.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/text_table.h"
#include "core/units.h"

namespace megaplan {

namespace {

using ActionKey = std::pair<int32_t, std::string>;  // pipeline rank, the action as written

std::map<ActionKey, const TimelineSlice*> by_action(const Timeline& timeline, const char* which) {
  std::map<ActionKey, const TimelineSlice*> slices;
  for (const TimelineSlice& slice : timeline.slices) {
    if (!slices.emplace(ActionKey{slice.pipeline_rank, to_string(slice.action)}, &slice).second) {
      throw SpecError(which, timeline.source + " holds " + to_string(slice.action) + " twice on pipeline rank " +
                                 std::to_string(slice.pipeline_rank) + ": one iteration's trace is expected");
    }
  }
  return slices;
}

std::vector<std::string> compute_order(const Timeline& timeline, int32_t rank) {
  std::vector<const TimelineSlice*> compute;
  for (const TimelineSlice& slice : timeline.slices) {
    if (slice.pipeline_rank == rank && slice.stream == TimelineStream::kCompute) compute.push_back(&slice);
  }
  std::stable_sort(compute.begin(), compute.end(),
                   [](const TimelineSlice* a, const TimelineSlice* b) { return a->start_s < b->start_s; });
  std::vector<std::string> order;
  for (const TimelineSlice* slice : compute) order.push_back(to_string(slice->action));
  return order;
}

}  // namespace

double relative_error(double simulated, double measured) {
  return measured == 0 ? 0.0 : (simulated - measured) / measured;
}

TimelineComparison compare_timelines(const Timeline& simulated, const Timeline& measured) {
  const auto simulated_slices = by_action(simulated, "--simulated");
  const auto measured_slices = by_action(measured, "--measured");
  for (const auto& [key, slice] : simulated_slices) {
    if (!measured_slices.count(key)) {
      throw SpecError("--measured", measured.source + " lacks " + key.second + " on pipeline rank " +
                                        std::to_string(key.first) + ", which " + simulated.source +
                                        " holds: the traces are of different plans");
    }
  }
  for (const auto& [key, slice] : measured_slices) {
    if (!simulated_slices.count(key)) {
      throw SpecError("--measured", measured.source + " holds " + key.second + " on pipeline rank " +
                                        std::to_string(key.first) + ", which " + simulated.source +
                                        " lacks: the traces are of different plans");
    }
  }

  TimelineComparison comparison;
  std::map<int32_t, RankComparison> ranks;
  std::map<int32_t, std::map<ActionKind, KindComparison>> kinds;
  std::map<int32_t, std::pair<double, double>> simulated_bounds, measured_bounds;  // first start, last end
  const auto widen = [](std::pair<double, double>& bounds, const TimelineSlice& slice, bool first) {
    bounds.first = first ? slice.start_s : std::min(bounds.first, slice.start_s);
    bounds.second = first ? slice.end_s : std::max(bounds.second, slice.end_s);
  };
  for (const auto& [key, simulated_slice] : simulated_slices) {
    const TimelineSlice& measured_slice = *measured_slices.at(key);
    const int32_t rank = key.first;
    const bool first = !ranks.count(rank);
    ranks[rank].pipeline_rank = rank;
    KindComparison& kind = kinds[rank][simulated_slice->action.kind];
    kind.kind = simulated_slice->action.kind;
    ++kind.count;
    kind.simulated_s += simulated_slice->end_s - simulated_slice->start_s;
    kind.measured_s += measured_slice.end_s - measured_slice.start_s;
    widen(simulated_bounds[rank], *simulated_slice, first);
    widen(measured_bounds[rank], measured_slice, first);
  }
  for (auto& [rank, result] : ranks) {
    for (const auto& [kind, totals] : kinds[rank]) result.kinds.push_back(totals);
    result.simulated_span_s = simulated_bounds[rank].second - simulated_bounds[rank].first;
    result.measured_span_s = measured_bounds[rank].second - measured_bounds[rank].first;
    result.same_compute_order = compute_order(simulated, rank) == compute_order(measured, rank);
    comparison.simulated_iteration_s = std::max(comparison.simulated_iteration_s, result.simulated_span_s);
    comparison.measured_iteration_s = std::max(comparison.measured_iteration_s, result.measured_span_s);
    comparison.ranks.push_back(std::move(result));
  }
  return comparison;
}

std::string comparison_table(const TimelineComparison& comparison) {
  TextTable table({"rank", "action", "count", "simulated ms/action", "measured ms/action", "error", "order"});
  for (const RankComparison& rank : comparison.ranks) {
    for (const KindComparison& kind : rank.kinds) {
      const double count = static_cast<double>(kind.count);
      table.add_row({std::to_string(rank.pipeline_rank), action_kind_token(kind.kind), std::to_string(kind.count),
                     milliseconds_number(kind.simulated_s / count), milliseconds_number(kind.measured_s / count),
                     format_percent(relative_error(kind.simulated_s, kind.measured_s), true),
                     rank.same_compute_order ? "same" : "differs"});
    }
    table.add_row({std::to_string(rank.pipeline_rank), "span", "1", milliseconds_number(rank.simulated_span_s),
                   milliseconds_number(rank.measured_span_s),
                   format_percent(relative_error(rank.simulated_span_s, rank.measured_span_s), true),
                   rank.same_compute_order ? "same" : "differs"});
  }
  return table.render();
}

}  // namespace megaplan
