// The schedule-kind table: spellings round-trip, V kinds run two stages per rank, the split-backward
// kinds are those whose generators emit I and W, and the shape predicate agrees with its errors.
#include <catch2/catch.hpp>

#include <string>

#include "core/error.h"
#include "core/parallel_plan.h"
#include "core/schedule/schedule.h"
#include "core/schedule/schedule_traits.h"

using megaplan::ScheduleKind;
using megaplan::ScheduleTraits;
using megaplan::StagePlacement;
using megaplan::StagesPerRank;

namespace {

// A vpp the kind accepts.
int64_t legal_vpp(const ScheduleTraits& traits) { return traits.stages_per_rank == StagesPerRank::kOne ? 1 : 2; }

bool emits_split_backward(const megaplan::PipelineSchedule& schedule) {
  for (const auto& actions : schedule.ranks) {
    for (const megaplan::Action& action : actions) {
      for (const megaplan::Action& part : megaplan::parts_of(action)) {
        if (part.kind == megaplan::ActionKind::kBackwardInput || part.kind == megaplan::ActionKind::kBackwardWeight) {
          return true;
        }
      }
    }
  }
  return false;
}

}  // namespace

TEST_CASE("every schedule kind has one row, in enum order, and round-trips its spelling", "[schedule][traits]") {
  const auto table = megaplan::all_schedule_traits();
  REQUIRE(table.size() == 6);
  for (std::size_t i = 0; i < table.size(); ++i) {
    const ScheduleTraits& traits = table[i];
    INFO(traits.spelling);
    CHECK(static_cast<std::size_t>(traits.kind) == i);
    CHECK(&megaplan::schedule_traits(traits.kind) == &traits);
    CHECK(megaplan::to_string(traits.kind) == traits.spelling);
    CHECK(megaplan::parse_schedule_kind(traits.spelling, "--schedule") == traits.kind);
    CHECK(megaplan::stage_placement(traits.kind) == traits.placement);
  }
  CHECK_THROWS_WITH(megaplan::parse_schedule_kind("zb-h2", "--schedule"),
                    "--schedule: must be one of gpipe, 1f1b, interleaved, zb-h1, zbv, dualpipev; got \"zb-h2\"");
}

TEST_CASE("V kinds place exactly two stages per rank; only interleaving takes the plan's vpp", "[schedule][traits]") {
  for (const ScheduleTraits& traits : megaplan::all_schedule_traits()) {
    INFO(traits.spelling);
    CHECK((traits.placement == StagePlacement::kV) == (traits.stages_per_rank == StagesPerRank::kTwo));
    CHECK((traits.stages_per_rank == StagesPerRank::kVirtual) == (traits.kind == ScheduleKind::kInterleaved));
    CHECK((traits.stages_per_rank == StagesPerRank::kVirtual) ==
          (traits.microbatch_rule == megaplan::MicrobatchRule::kInterleavedGroups));
    // Only 1f1b is worth running on one pipeline rank.
    CHECK(traits.pipeline_only == (traits.kind != ScheduleKind::kOneFOneB));
  }
  CHECK(megaplan::schedule_traits(ScheduleKind::kZeroBubbleV).placement == StagePlacement::kV);
  CHECK(megaplan::schedule_traits(ScheduleKind::kDualPipeV).placement == StagePlacement::kV);
}

TEST_CASE("the split-backward kinds are zb-h1, zbv and dualpipev, as their generators emit I and W",
          "[schedule][traits]") {
  for (const ScheduleTraits& traits : megaplan::all_schedule_traits()) {
    INFO(traits.spelling);
    const megaplan::PipelineSchedule schedule = megaplan::generate_schedule(traits.kind, 4, legal_vpp(traits), 16);
    CHECK(traits.splits_backward == emits_split_backward(schedule));
    CHECK(schedule.shape.placement == traits.placement);
  }
  CHECK(megaplan::schedule_traits(ScheduleKind::kZeroBubbleH1).splits_backward);
  CHECK(megaplan::schedule_traits(ScheduleKind::kZeroBubbleV).splits_backward);
  CHECK(megaplan::schedule_traits(ScheduleKind::kDualPipeV).splits_backward);
}

TEST_CASE("schedule_shape_ok is true exactly where check_schedule_shape throws nothing", "[schedule][traits]") {
  for (const ScheduleTraits& traits : megaplan::all_schedule_traits()) {
    for (int64_t pp = 1; pp <= 4; ++pp) {
      for (int64_t vpp = 1; vpp <= 3; ++vpp) {
        for (int64_t microbatches = 1; microbatches <= 10; ++microbatches) {
          for (int64_t group = pp; group <= pp + 2; ++group) {
            INFO(traits.spelling << " pp " << pp << " vpp " << vpp << " M " << microbatches << " group " << group);
            const bool ok = megaplan::schedule_shape_ok(traits.kind, pp, vpp, microbatches, group);
            for (megaplan::ShapeFlags flags : {megaplan::ShapeFlags::kPlan, megaplan::ShapeFlags::kGenerator}) {
              bool threw = false;
              try {
                megaplan::check_schedule_shape(traits.kind, pp, vpp, microbatches, group, flags);
              } catch (const megaplan::SpecError&) {
                threw = true;
              }
              CHECK(threw == !ok);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("shape errors keep a plan's and a generator's words", "[schedule][traits]") {
  using megaplan::ShapeFlags;
  const auto message = [](ScheduleKind kind, int64_t pp, int64_t vpp, int64_t microbatches, ShapeFlags flags) {
    try {
      megaplan::check_schedule_shape(kind, pp, vpp, microbatches, pp, flags);
    } catch (const megaplan::SpecError& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  CHECK(message(ScheduleKind::kGPipe, 4, 2, 8, ShapeFlags::kPlan) ==
        "--schedule: gpipe runs one stage per rank; needs vpp = 1, got 2");
  CHECK(message(ScheduleKind::kGPipe, 4, 2, 8, ShapeFlags::kGenerator) ==
        "--vpp: gpipe runs one stage per rank; needs vpp = 1, got 2");
  CHECK(message(ScheduleKind::kZeroBubbleV, 4, 1, 8, ShapeFlags::kPlan) ==
        "--schedule: zbv places two stages per rank in a V; needs vpp = 2, got 1");
  CHECK(message(ScheduleKind::kZeroBubbleV, 4, 1, 8, ShapeFlags::kGenerator) ==
        "--vpp: zbv runs two stages per rank in a V; needs vpp = 2, got 1");
  CHECK(message(ScheduleKind::kDualPipeV, 4, 2, 7, ShapeFlags::kPlan) ==
        "--global-batch-size: dualpipev needs at least 2 * pp = 8 microbatches per replica, got 7");
  CHECK(message(ScheduleKind::kDualPipeV, 4, 2, 7, ShapeFlags::kGenerator) ==
        "--microbatches: dualpipev needs at least as many microbatches as stages (2 * pp = 8), got 7");
  CHECK(message(ScheduleKind::kInterleaved, 4, 2, 6, ShapeFlags::kPlan) ==
        "--global-batch-size: the interleaved schedule needs microbatches % group size to be 0 or >= pp; got "
        "6 % 4 = 2 with pp 4");
  CHECK(message(ScheduleKind::kInterleaved, 4, 2, 6, ShapeFlags::kGenerator) ==
        "--microbatches: the interleaved schedule needs microbatches % group size to be 0 or >= pp; got "
        "6 % 4 = 2 with pp 4");
  CHECK(message(ScheduleKind::kOneFOneB, 1, 1, 1, ShapeFlags::kPlan) == "no error");
}
