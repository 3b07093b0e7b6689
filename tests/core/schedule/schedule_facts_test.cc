// Per-rank facts: activation memory from the action order, message counts from the lowering.
#include <catch2/catch.hpp>

#include "core/schedule/generators.h"
#include "core/schedule/lowering.h"
#include "core/schedule/schedule_facts.h"

using megaplan::ScheduleKind;

TEST_CASE("1F1B's facts: pp - rank microbatches held, one message per microbatch each way", "[schedule][facts]") {
  const auto schedule = megaplan::lower_schedule(megaplan::generate_schedule(ScheduleKind::kOneFOneB, 4, 1, 8));
  const std::vector<megaplan::StageActivationBytes> bytes(4, {10, 4});
  const auto facts = megaplan::schedule_facts(schedule, bytes, 3);
  REQUIRE(facts.size() == 4);
  for (int64_t rank = 0; rank < 4; ++rank) {
    const auto& rank_facts = facts[static_cast<std::size_t>(rank)];
    INFO("rank " << rank);
    CHECK(rank_facts.compute_actions == 16);
    CHECK(rank_facts.peak_inflight_microbatches == 4 - rank);
    CHECK(rank_facts.peak_held_bytes == 10 * (4 - rank));
    // Inner ranks send activations forward and gradients back; the ends do one of the two.
    const int64_t directions = (rank == 0 || rank == 3) ? 1 : 2;
    CHECK(rank_facts.sends == 8 * directions);
    CHECK(rank_facts.receives == 8 * directions);
    CHECK(rank_facts.sent_bytes == 3 * 8 * directions);
  }
}

TEST_CASE("a split backward keeps W's inputs until W runs", "[schedule][facts]") {
  // zb-h1, pp 2, M 2, rank 1: F0 I0 F1 I1 W0 W1 -> held 10, 4, 14, 8, 4, 0.
  megaplan::PipelineSchedule schedule = megaplan::generate_schedule(ScheduleKind::kZeroBubbleH1, 2, 1, 2);
  REQUIRE(megaplan::to_string(schedule.ranks[1]) == "1F0 1I0 1F1 1I1 1W0 1W1");
  const auto facts = megaplan::schedule_facts(schedule, {{10, 4}, {10, 4}});
  CHECK(facts[1].peak_held_bytes == 14);
  CHECK(facts[1].peak_inflight_microbatches == 1);
  CHECK(facts[1].sends == 0);  // not lowered: no messages yet
}
