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
std::string ranked_plans_table(const std::vector<RankedPlan>& plans, std::optional<double> best_s = std::nullopt,
                               std::optional<int64_t> memory_limit_bytes = std::nullopt);

// #1 against #2: the two layouts, each term's mean seconds per pipeline rank and their
// difference, the memory each leaves free under `memory_limit_bytes`, and the term that differs
// most. With fewer than two plans, one line saying there is nothing to compare.
std::string winner_explanation(const std::vector<RankedPlan>& plans, int64_t memory_limit_bytes);

}  // namespace megaplan
