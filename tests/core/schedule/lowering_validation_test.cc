// Lowering and validation: every generated schedule lowers and validates; broken ones are refused.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <utility>

#include "core/schedule/lowering.h"
#include "core/schedule/validation.h"

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using megaplan::ScheduleKind;

namespace {

std::vector<std::string> rows(const megaplan::PipelineSchedule& schedule) {
  std::vector<std::string> text;
  for (const auto& actions : schedule.ranks) text.push_back(megaplan::to_string(actions));
  return text;
}

megaplan::PipelineSchedule lowered_1f1b_pp2_m2() {
  return megaplan::lower_schedule(megaplan::generate_schedule(ScheduleKind::kOneFOneB, 2, 1, 2));
}

}  // namespace

TEST_CASE("lowering inserts sends, the receiver's receives, REDUCE_GRAD and OPTIM", "[schedule][lowering]") {
  // Worked by hand from the rounds: each rank schedules one compute action per round, rank 0 first.
  CHECK(rows(lowered_1f1b_pp2_m2()) ==
        std::vector<std::string>{"0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1 0REDUCE_GRAD OPTIM",
                                 "1RECV_F0 1F0 1RECV_F1 1B0 1SEND_B0 1F1 1B1 1SEND_B1 1REDUCE_GRAD OPTIM"});
  // One rank: nothing to send.
  CHECK(rows(megaplan::lower_schedule(megaplan::generate_schedule(ScheduleKind::kOneFOneB, 1, 1, 2))) ==
        std::vector<std::string>{"0F0 0B0 0F1 0B1 0REDUCE_GRAD OPTIM"});
}

TEST_CASE("every generated schedule validates before and after lowering", "[schedule][lowering]") {
  for (int64_t pp = 1; pp <= 8; ++pp) {
    for (int64_t microbatches = 1; microbatches <= 32; ++microbatches) {
      for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
        INFO(megaplan::to_string(kind) << " pp " << pp << " M " << microbatches);
        const megaplan::PipelineSchedule compute = megaplan::generate_schedule(kind, pp, 1, microbatches);
        REQUIRE_NOTHROW(megaplan::validate_schedule(compute));
        REQUIRE_NOTHROW(megaplan::validate_schedule(megaplan::lower_schedule(compute)));
      }
      // Every group size Megatron accepts for this M (the others are refused before generating).
      for (int64_t vpp = 2; vpp <= 4 && pp >= 2; ++vpp) {
        for (int64_t group = pp; group <= microbatches; ++group) {
          const int64_t final_group = microbatches % group;
          if (final_group > 0 && final_group < pp) continue;
          INFO("interleaved pp " << pp << " vpp " << vpp << " M " << microbatches << " group " << group);
          const megaplan::PipelineSchedule compute =
              megaplan::generate_schedule(ScheduleKind::kInterleaved, pp, vpp, microbatches, group);
          REQUIRE_NOTHROW(megaplan::validate_schedule(compute));
          REQUIRE_NOTHROW(megaplan::validate_schedule(megaplan::lower_schedule(compute)));
        }
      }
    }
  }
}

TEST_CASE("swapped receives are out-of-order messages", "[schedule][validation]") {
  megaplan::PipelineSchedule schedule = lowered_1f1b_pp2_m2();
  std::swap(schedule.ranks[1][0], schedule.ranks[1][2]);  // 1RECV_F1 before 1RECV_F0
  try {
    megaplan::validate_schedule(schedule);
    FAIL("expected a ScheduleError");
  } catch (const megaplan::ScheduleError& error) {
    CHECK_THAT(error.what(), StartsWith("schedule: out-of-order messages from rank 0 to rank 1: message 0 is sent as "
                                        "0SEND_F0 (rank 0, step 1) but received as 1RECV_F1 (rank 1, step 0)"));
    CHECK_THAT(error.grid(), Contains("rank 1: >>1RECV_F1<< 1F0"));
  }
}

TEST_CASE("waiting on a message the rank sends later is a deadlock", "[schedule][validation]") {
  megaplan::PipelineSchedule schedule = lowered_1f1b_pp2_m2();
  // Rank 0 waits for the gradient of microbatch 0 before it sends that microbatch's activations.
  std::vector<megaplan::Action>& rank0 = schedule.ranks[0];
  const megaplan::Action receive = rank0[4];
  rank0.erase(rank0.begin() + 4);
  rank0.insert(rank0.begin() + 1, receive);
  CHECK_THROWS_WITH(megaplan::validate_schedule(schedule),
                    StartsWith("schedule: deadlock: these actions wait on each other: ") && Contains("0RECV_B0") &&
                        Contains("0SEND_F0") && Contains("1B0"));
}

TEST_CASE("a deadlock with a message in flight is a deadlock", "[schedule][validation]") {
  // 1F1B pp 2, M 1, rank 1's F0 before the RECV_F0 it needs: rank 0 has sent, rank 1 never receives.
  megaplan::PipelineSchedule schedule =
      megaplan::lower_schedule(megaplan::generate_schedule(ScheduleKind::kOneFOneB, 2, 1, 1));
  REQUIRE(rows(schedule)[1] == "1RECV_F0 1F0 1B0 1SEND_B0 1REDUCE_GRAD OPTIM");
  std::swap(schedule.ranks[1][0], schedule.ranks[1][1]);
  CHECK_THROWS_WITH(megaplan::validate_schedule(schedule),
                    "schedule: deadlock: these actions wait on each other: 1RECV_F0 (rank 1, step 1) -> 1F0 (rank 1, "
                    "step 0) -> 1RECV_F0");
}

TEST_CASE("a repeated message or gradient reduction is repeated work", "[schedule][validation]") {
  // Sent twice and received twice, in matching order: a receive must not take the first copy's key
  // for the second copy's arrival.
  megaplan::PipelineSchedule messages =
      megaplan::lower_schedule(megaplan::generate_schedule(ScheduleKind::kOneFOneB, 2, 1, 1));
  messages.ranks[0].insert(messages.ranks[0].begin() + 3, messages.ranks[0][1]);  // 0SEND_F0 after 0RECV_B0
  messages.ranks[1].insert(messages.ranks[1].begin() + 1, messages.ranks[1][0]);  // 1RECV_F0 twice
  CHECK_THROWS_WITH(megaplan::validate_schedule(messages),
                    "schedule: duplicate: 1RECV_F0 (rank 1, step 1) repeats the work of 1RECV_F0 (rank 1, step 0)");

  megaplan::PipelineSchedule reduction = lowered_1f1b_pp2_m2();
  reduction.ranks[0].insert(reduction.ranks[0].end() - 1,  // a second 0REDUCE_GRAD before OPTIM
                            megaplan::make_action(megaplan::ActionKind::kReduceGrad, 0, -1));
  CHECK_THROWS_WITH(megaplan::validate_schedule(reduction),
                    StartsWith("schedule: duplicate: 0REDUCE_GRAD (rank 0, step 9)"));
}

TEST_CASE("missing, duplicate and misplaced work is refused", "[schedule][validation]") {
  megaplan::PipelineSchedule missing = megaplan::generate_schedule(ScheduleKind::kOneFOneB, 2, 1, 2);
  missing.ranks[1].pop_back();  // 1B1
  CHECK_THROWS_WITH(megaplan::validate_schedule(missing),
                    "schedule: incomplete: no rank runs 1B1 (a B, or an I and a W)");

  megaplan::PipelineSchedule duplicate = megaplan::generate_schedule(ScheduleKind::kOneFOneB, 2, 1, 2);
  duplicate.ranks[0].push_back(megaplan::forward(0, 0));
  CHECK_THROWS_WITH(megaplan::validate_schedule(duplicate),
                    "schedule: duplicate: 0F0 (rank 0, step 4) repeats the work of 0F0 (rank 0, step 0)");

  megaplan::PipelineSchedule misplaced = megaplan::generate_schedule(ScheduleKind::kOneFOneB, 2, 1, 2);
  misplaced.ranks[0][0] = megaplan::forward(1, 0);
  CHECK_THROWS_WITH(megaplan::validate_schedule(misplaced), "schedule: 1F0 (rank 0, step 0) belongs to rank 1");

  // A compute order that waits on later work cannot be lowered.
  megaplan::PipelineSchedule backwards_first = megaplan::generate_schedule(ScheduleKind::kOneFOneB, 2, 1, 1);
  std::swap(backwards_first.ranks[0][0], backwards_first.ranks[0][1]);  // 0B0 before 0F0
  CHECK_THROWS_WITH(megaplan::lower_schedule(backwards_first), StartsWith("schedule: cannot lower: no rank can run"));
  CHECK_THROWS_WITH(megaplan::validate_schedule(backwards_first), StartsWith("schedule: deadlock"));
}

TEST_CASE("a large schedule's error grid shows the marked cells with their neighbours only", "[schedule][validation]") {
  megaplan::PipelineSchedule schedule =
      megaplan::lower_schedule(megaplan::generate_schedule(ScheduleKind::kInterleaved, 8, 2, 64));
  schedule.ranks[3][500] = megaplan::forward(3, 0);  // runs 3F0 a second time
  try {
    megaplan::validate_schedule(schedule);
    FAIL("the repeated forward was not refused");
  } catch (const megaplan::ScheduleError& error) {
    const std::string& grid = error.grid();
    CHECK(grid.find(">>") != std::string::npos);
    CHECK(grid.find(" ...") != std::string::npos);
    CHECK(grid.size() < 8 * 40 * 32);  // eight rows of a few dozen actions, not 8 x 700
    CHECK(std::count(grid.begin(), grid.end(), '\n') == 8);
  }
}
