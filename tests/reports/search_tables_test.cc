// search's text: the ranked table marks ties and the slowdown against #1; the explanation names
// the term that differs most.
#include <catch2/catch.hpp>

#include <algorithm>

#include "reports/memory_table.h"
#include "reports/search_tables.h"

using Catch::Matchers::Contains;

namespace {

megaplan::RankedPlan ranked(int64_t tp, double seconds, double tensor_comm_s, bool tie) {
  megaplan::RankedPlan plan;
  plan.plan.tensor_parallel_size = tp;
  plan.plan.data_parallel_size = 8 / tp;
  plan.estimate.iteration_time_s = seconds;
  plan.estimate.compute_s = 1.0;
  plan.estimate.tensor_comm_s = tensor_comm_s;
  plan.peak_memory_bytes = int64_t{10} << 30;
  plan.tie = tie;
  return plan;
}

}  // namespace

TEST_CASE("the ranked table marks ties and the slowdown against #1", "[reports]") {
  const std::string table = megaplan::ranked_plans_table({ranked(2, 1.0, 0.0, false), ranked(4, 1.04, 0.04, true)});
  CHECK_THAT(table, Contains("+4.0% tie"));
  CHECK_THAT(table, Contains("10.00 GiB"));
}

TEST_CASE("the explanation names the largest term, and says when there is nothing to compare", "[reports]") {
  const std::string text =
      megaplan::winner_explanation({ranked(2, 1.0, 0.0, false), ranked(4, 1.04, 0.04, true)}, int64_t{16} << 30);
  CHECK_THAT(text, Contains("Why #1 beats #2 by 0.0400 s"));
  CHECK_THAT(text, Contains("The largest difference is tp/cp communication (0.0400 s)"));
  CHECK_THAT(text, Contains("6.00 GiB"));  // headroom under 16 GiB
  CHECK(megaplan::winner_explanation({ranked(2, 1.0, 0.0, false)}, 0) ==
        "Only one plan fits: nothing to compare it with.\n");
}

TEST_CASE("the memory table is in GiB with a total per rank", "[reports]") {
  megaplan::PipelineRankMemory rank;
  rank.pipeline_rank = 3;
  rank.weight_bytes = int64_t{3} << 29;  // 1.5 GiB
  rank.total_bytes = int64_t{5} << 30;
  const std::string table = megaplan::memory_table({rank});
  CHECK_THAT(table, Contains("total GiB"));
  CHECK_THAT(table, Contains("3     1.50"));
  CHECK_THAT(table, Contains("5.00"));
}

TEST_CASE("plans that differ only in a switch within the uncertainty share a row", "[reports]") {
  megaplan::RankedPlan sp_off = ranked(2, 1.0, 0.0, false);
  megaplan::RankedPlan sp_on = ranked(2, 1.01, 0.0, true);
  sp_on.plan.sequence_parallel = true;
  megaplan::RankedPlan other = ranked(4, 1.02, 0.02, true);
  megaplan::RankedPlan far = ranked(2, 1.2, 0.0, false);
  far.plan.use_distributed_optimizer = true;
  const std::vector<megaplan::RankedPlan> plans = {sp_off, sp_on, other, far};
  const std::string collapsed = megaplan::ranked_plans_table(plans, std::nullopt, std::nullopt, 0.05);
  CHECK_THAT(collapsed, Contains("1,2 "));
  CHECK_THAT(collapsed, Contains("off/on"));
  // A header and three rows: #2 joins #1; #4, 20% slower, is outside the uncertainty.
  CHECK(std::count(collapsed.begin(), collapsed.end(), '\n') == 4);
  const std::string whole = megaplan::ranked_plans_table(plans);
  CHECK(std::count(whole.begin(), whole.end(), '\n') == 5);
  CHECK_THAT(whole, !Contains("off/on"));
  // --explain sets #1 against the best other layout, not against its own variant.
  const std::string text = megaplan::winner_explanation(plans, int64_t{16} << 30);
  CHECK_THAT(text, Contains("Why #1 beats #3 (the best other layout) by 0.0200 s"));
}
