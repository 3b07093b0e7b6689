// search's text: the ranked table marks ties and the slowdown against #1; the explanation names
// the term that differs most.
#include <catch2/catch.hpp>

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
