// --rampup-batch-size against Megatron's calculator, worked by hand for the GPT-3 175B example
// script's ramp (16 16 5859375 to 1536: 95 increments of 61677.63 samples each).
#include <catch2/catch.hpp>

#include "core/batch_rampup.h"
#include "core/error.h"
#include "core/parallel_plan.h"

namespace {

megaplan::ParallelPlan plan_with(int64_t micro_batch_size, int64_t data_parallel_size, int64_t global_batch_size) {
  megaplan::ParallelPlan plan;
  plan.micro_batch_size = micro_batch_size;
  plan.data_parallel_size = data_parallel_size;
  plan.global_batch_size = global_batch_size;
  return plan;
}

std::string refusal(const megaplan::BatchRampup& rampup, const megaplan::ParallelPlan& plan) {
  try {
    megaplan::validate_batch_rampup(rampup, plan);
  } catch (const megaplan::SpecError& error) {
    return error.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the ramp's global batch steps as Megatron's calculator does", "[rampup]") {
  const std::optional<megaplan::BatchRampup> gpt3 = megaplan::BatchRampup{16, 16, 5859375};
  CHECK(megaplan::rampup_global_batch(gpt3, 1536, 0) == 16);
  CHECK(megaplan::rampup_global_batch(gpt3, 1536, 61677) == 16);  // below one increment's 61677.63
  CHECK(megaplan::rampup_global_batch(gpt3, 1536, 61678) == 32);
  CHECK(megaplan::rampup_global_batch(gpt3, 1536, 5859374) == 1520);
  CHECK(megaplan::rampup_global_batch(gpt3, 1536, 5859375) == 1536);  // 95 increments exactly
  CHECK(megaplan::rampup_global_batch(gpt3, 1536, 6000000) == 1536);
  CHECK(megaplan::rampup_global_batch(std::nullopt, 1536, 0) == 1536);
  CHECK(megaplan::rampup_global_batches(gpt3, 1536).size() == 96);
  CHECK(megaplan::rampup_global_batches(std::nullopt, 8) == std::vector<int64_t>{8});

  // 2 by 2 to 6 over 8 samples (4 per increment): batches 2, 2, 4, 4 (consumed 8, not past the
  // ramp: 2 steps), then 6.
  const std::optional<megaplan::BatchRampup> small = megaplan::BatchRampup{2, 2, 8};
  std::vector<int64_t> batches;
  int64_t consumed = 0;
  for (int i = 0; i < 6; ++i) {
    batches.push_back(megaplan::rampup_global_batch(small, 6, consumed));
    consumed += batches.back();
  }
  CHECK(batches == std::vector<int64_t>{2, 2, 4, 6, 6, 6});
  CHECK(megaplan::samples_of_iterations(small, 6, 6) == 26);
  CHECK(megaplan::samples_of_iterations(small, 6, 2) == 4);
  CHECK(megaplan::samples_of_iterations(std::nullopt, 6, 5) == 30);
  CHECK_THROWS_AS(megaplan::samples_of_iterations(small, 6, int64_t{1} << 62), megaplan::SpecError);
}

TEST_CASE("a ramp the plan cannot run is refused naming the rule", "[rampup]") {
  const megaplan::ParallelPlan plan = plan_with(2, 4, 64);  // batches in steps of 8
  CHECK(refusal({8, 8, 1000}, plan).empty());
  CHECK(refusal({0, 8, 1000}, plan).find("--rampup-batch-size: the start batch must be positive and below") == 0);
  CHECK(refusal({64, 8, 1000}, plan).find("below --global-batch-size 64, got 64") != std::string::npos);
  CHECK(refusal({8, 0, 1000}, plan).find("the increment must be positive") != std::string::npos);
  CHECK(refusal({8, 8, -1}, plan).find("samples must be non-negative") != std::string::npos);
  CHECK(refusal({8, 24, 1000}, plan).find("the increment 24 must divide --global-batch-size minus the start, 56") !=
        std::string::npos);
  CHECK(refusal({4, 4, 1000}, plan).find("multiple of micro-batch size x data-parallel size 8, and 4 is not") !=
        std::string::npos);
  CHECK(refusal({16, 12, 1000}, plan_with(2, 4, 52)).find("and 12 is not") != std::string::npos);
}
