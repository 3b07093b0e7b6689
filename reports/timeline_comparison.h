// A simulated timeline against a measured one (`megaplan compare`): per pipeline rank and action
// kind, how long the actions took in each, the iteration time of each, and whether every rank ran
// its compute stream's actions in the simulated order. Both come from the same lowered lists, so
// they must hold the same actions; the simulator's error is then read per action kind.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/schedule/action.h"
#include "core/timeline.h"

namespace megaplan {

struct KindComparison {
  ActionKind kind = ActionKind::kForward;
  int64_t count = 0;       // actions of this kind on the rank
  double simulated_s = 0;  // their durations, summed
  double measured_s = 0;
};

struct RankComparison {
  int32_t pipeline_rank = 0;
  std::vector<KindComparison> kinds;  // in ActionKind order, kinds the rank runs only
  double simulated_span_s = 0;        // from the rank's first start to its last end
  double measured_span_s = 0;
  // The compute stream's actions ordered by start time are the same sequence in both.
  bool same_compute_order = false;
};

struct TimelineComparison {
  std::vector<RankComparison> ranks;  // by pipeline rank
  double simulated_iteration_s = 0;   // the longest rank span
  double measured_iteration_s = 0;
};

// (simulated - measured) / measured; 0 when measured is 0.
double relative_error(double simulated, double measured);

// Throws SpecError("--measured", ...) naming the first difference when the two timelines do not
// hold the same actions on the same ranks (another plan, or a trace of another iteration shape).
TimelineComparison compare_timelines(const Timeline& simulated, const Timeline& measured);

// `megaplan compare`'s table: per rank and action kind, milliseconds per action simulated and
// measured, the error and whether the rank kept the simulated order; then the rank's span.
std::string comparison_table(const TimelineComparison& comparison);

}  // namespace megaplan
