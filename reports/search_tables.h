// `megaplan search`'s text: the ranked plans as a table, and why the winner beats the runner-up,
// term by term (--explain).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/step_time_estimator.h"

namespace megaplan {

// One row per plan, best first: its layout, iteration time, TFLOP/s, MFU, peak memory (GiB) and
// how much slower than #1 it is ("tie" where the profile cannot tell it from #1). `best_s`, when
// given, is #1's time for plans that are not themselves the ranking (search's over_memory);
// `memory_limit_bytes`, when given, adds a "fits" column (search --compare costs plans that do not).
// With `collapse_within` (the profile's stated uncertainty, a fraction), a plan that differs from a
// faster row only in its switches (sequence parallelism, the distributed optimizer) and is within
// that share of it joins its row: the "#" cell lists every rank, the switch cells every variant
// ("off/on"), the numbers stay the faster plan's.
std::string ranked_plans_table(const std::vector<RankedPlan>& plans, std::optional<double> best_s = std::nullopt,
                               std::optional<int64_t> memory_limit_bytes = std::nullopt,
                               std::optional<double> collapse_within = std::nullopt);

// Whether two plans differ in more than their switches (sequence parallelism, the distributed
// optimizer): another layout, not a variant of one.
bool structurally_different(const ParallelPlan& a, const ParallelPlan& b);

// #1 against the best plan structurally different from it (#2 where none is): the two layouts,
// each term's mean seconds per pipeline rank and their difference, the memory each leaves free
// under `memory_limit_bytes`, and the term that differs most. With fewer than two plans, one line
// saying there is nothing to compare.
std::string winner_explanation(const std::vector<RankedPlan>& plans, int64_t memory_limit_bytes);

}  // namespace megaplan
