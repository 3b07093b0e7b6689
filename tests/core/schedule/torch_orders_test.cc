// zb-h1, zbv and dualpipev against torch.distributed.pipelining's own orders, recorded by
// tools/torch_schedule_orders.py from torch 2.11 (tests/data/torch_schedules/orders.json).
#include <catch2/catch.hpp>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/parallel_plan.h"
#include "core/schedule/generators.h"
#include "core/schedule/lowering.h"
#include "core/schedule/schedule.h"
#include "core/schedule/schedule_facts.h"
#include "core/schedule/validation.h"

namespace {

nlohmann::json torch_orders() {
  std::ifstream in(std::string(MEGAPLAN_TEST_DATA_DIR) + "/torch_schedules/orders.json");
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

megaplan::ScheduleKind kind_of(const std::string& name) { return megaplan::parse_schedule_kind(name, "kind"); }

}  // namespace

TEST_CASE("zb-h1, zbv and dualpipev equal torch's orders for pp 1-8, M 1-24 and 32", "[schedule][torch]") {
  const nlohmann::json orders = torch_orders();
  std::size_t compared = 0;
  for (const nlohmann::json& entry : orders.at("schedules")) {
    const std::string kind = entry.at("kind");
    const int64_t pp = entry.at("pp");
    const int64_t microbatches = entry.at("microbatches");
    const int64_t vpp = kind == "zb-h1" ? 1 : 2;
    INFO(kind << " pp " << pp << " M " << microbatches);
    const megaplan::PipelineSchedule schedule = megaplan::generate_schedule(kind_of(kind), pp, vpp, microbatches);
    REQUIRE(schedule.ranks.size() == static_cast<std::size_t>(pp));
    for (int64_t rank = 0; rank < pp; ++rank) {
      INFO("rank " << rank);
      CHECK(megaplan::to_string(schedule.ranks[static_cast<std::size_t>(rank)]) ==
            entry.at("ranks").at(static_cast<std::size_t>(rank)).get<std::string>());
    }
    ++compared;
  }
  CHECK(compared > 500);
}

TEST_CASE("zero-bubble and V schedules validate before and after lowering", "[schedule][lowering]") {
  using megaplan::ScheduleKind;
  for (int64_t pp = 1; pp <= 8; ++pp) {
    for (int64_t microbatches = 1; microbatches <= 32; ++microbatches) {
      for (const auto& [kind, vpp] :
           {std::pair{ScheduleKind::kZeroBubbleH1, 1}, std::pair{ScheduleKind::kZeroBubbleV, 2},
            std::pair{ScheduleKind::kDualPipeV, 2}}) {
        if (kind == ScheduleKind::kDualPipeV && microbatches < 2 * pp) continue;
        INFO(megaplan::to_string(kind) << " pp " << pp << " M " << microbatches);
        const megaplan::PipelineSchedule compute = megaplan::generate_schedule(kind, pp, vpp, microbatches);
        REQUIRE_NOTHROW(megaplan::validate_schedule(compute));
        REQUIRE_NOTHROW(megaplan::validate_schedule(megaplan::lower_schedule(compute)));
      }
    }
  }
}

TEST_CASE("ZB-H1 keeps 1F1B's activation memory", "[schedule][generators]") {
  for (int64_t pp = 1; pp <= 8; ++pp) {
    for (int64_t microbatches = 1; microbatches <= 32; ++microbatches) {
      for (int64_t rank = 0; rank < pp; ++rank) {
        CHECK(megaplan::peak_inflight_microbatches(megaplan::zero_bubble_h1_schedule(pp, microbatches, rank)) ==
              megaplan::peak_inflight_microbatches(megaplan::one_f_one_b_schedule(pp, microbatches, rank)));
      }
    }
  }
}

TEST_CASE("V schedules need two stages per rank; dualpipev needs M >= 2pp", "[schedule][generators]") {
  using Catch::Matchers::Contains;
  using megaplan::ScheduleKind;
  CHECK_THROWS_WITH(megaplan::generate_schedule(ScheduleKind::kZeroBubbleV, 4, 3, 8),
                    "--vpp: zbv runs two stages per rank in a V; needs vpp = 2, got 3");
  CHECK_THROWS_WITH(megaplan::generate_schedule(ScheduleKind::kDualPipeV, 4, 1, 8), Contains("needs vpp = 2, got 1"));
  CHECK_THROWS_WITH(megaplan::generate_schedule(ScheduleKind::kDualPipeV, 4, 2, 7),
                    "--microbatches: dualpipev needs at least as many microbatches as stages (2 * pp = 8), got 7");
  CHECK_THROWS_WITH(megaplan::generate_schedule(ScheduleKind::kZeroBubbleH1, 4, 2, 8),
                    "--vpp: zb-h1 runs one stage per rank; needs vpp = 1, got 2");
}
