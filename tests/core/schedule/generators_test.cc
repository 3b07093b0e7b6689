// Generators against Megatron-LM's orders, and the in-flight property of 1F1B.
#include <catch2/catch.hpp>

#include <algorithm>

#include "core/error.h"

#include "core/schedule/generators.h"
#include "core/schedule/schedule.h"
#include "core/schedule/schedule_facts.h"

using Catch::Matchers::Contains;

TEST_CASE("1F1B matches Megatron's order for pp 4, M 8", "[schedule][generators]") {
  CHECK(megaplan::to_string(megaplan::one_f_one_b_schedule(4, 8, 0)) ==
        "0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7");
  // The last rank has no warm-up: it alternates from the start.
  CHECK(megaplan::to_string(megaplan::one_f_one_b_schedule(4, 8, 3)) ==
        "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 3F6 3B6 3F7 3B7");
  // Fewer microbatches than stages: all forwards, then all backwards.
  CHECK(megaplan::to_string(megaplan::one_f_one_b_schedule(4, 2, 0)) == "0F0 0F1 0B0 0B1");
}

TEST_CASE("GPipe runs every forward before any backward", "[schedule][generators]") {
  CHECK(megaplan::to_string(megaplan::gpipe_schedule(2, 3, 1)) == "1F0 1F1 1F2 1B0 1B1 1B2");
  CHECK(megaplan::peak_inflight_microbatches(megaplan::gpipe_schedule(4, 16, 2)) == 16);
}

TEST_CASE("1F1B holds min(pp - rank, M) microbatches and runs each F and B once", "[schedule][generators]") {
  for (int64_t pp = 1; pp <= 8; ++pp) {
    for (int64_t microbatches = 1; microbatches <= 32; ++microbatches) {
      for (int64_t rank = 0; rank < pp; ++rank) {
        INFO("pp " << pp << " M " << microbatches << " rank " << rank);
        const auto actions = megaplan::one_f_one_b_schedule(pp, microbatches, rank);
        CHECK(megaplan::peak_inflight_microbatches(actions) == std::min(pp - rank, microbatches));
        REQUIRE(actions.size() == static_cast<std::size_t>(2 * microbatches));
        std::vector<int> forwards(static_cast<std::size_t>(microbatches)), backwards(forwards.size());
        for (const megaplan::Action& action : actions) {
          CHECK(action.stage == rank);
          auto& seen = action.kind == megaplan::ActionKind::kForward ? forwards : backwards;
          // A backward never precedes its own forward.
          if (action.kind == megaplan::ActionKind::kBackward)
            CHECK(forwards[static_cast<std::size_t>(action.microbatch)] == 1);
          ++seen[static_cast<std::size_t>(action.microbatch)];
        }
        CHECK(std::all_of(forwards.begin(), forwards.end(), [](int n) { return n == 1; }));
        CHECK(std::all_of(backwards.begin(), backwards.end(), [](int n) { return n == 1; }));
      }
    }
  }
}

TEST_CASE("the interleaved table matches Megatron's docstring example", "[schedule][generators]") {
  // get_schedule_table's docstring: M 4, 2 chunks, group 2 -> chunks 0 0 1 1 0 0 1 1,
  // microbatches 0 1 0 1 2 3 2 3.
  using V = megaplan::VirtualMicrobatch;
  CHECK(megaplan::interleaved_schedule_table(4, 2, 2) ==
        std::vector<V>{{0, 0}, {1, 0}, {0, 1}, {1, 1}, {2, 0}, {3, 0}, {2, 1}, {3, 1}});
  // The docstring of the current get_schedule_table: "PP2 N3M5 with VP2" (group 3, M 5) ->
  // microbatches 0 1 2 0 1 2 3 4 3 4, chunks 0 0 0 1 1 1 0 0 1 1.
  CHECK(megaplan::interleaved_schedule_table(5, 2, 3) ==
        std::vector<V>{{0, 0}, {1, 0}, {2, 0}, {0, 1}, {1, 1}, {2, 1}, {3, 0}, {4, 0}, {3, 1}, {4, 1}});
  // M 5, group 2: groups {0,1}, {2,3}, and a last group {4} that runs through both chunks alone.
  CHECK(megaplan::interleaved_schedule_table(5, 2, 2) ==
        std::vector<V>{{0, 0}, {1, 0}, {0, 1}, {1, 1}, {2, 0}, {3, 0}, {2, 1}, {3, 1}, {4, 0}, {4, 1}});
}

TEST_CASE("interleaved 1F1B follows Megatron for pp 2, vpp 2, M 4", "[schedule][generators]") {
  // Rank 0 warms up (2-0-1)*2 + (2-1)*2 = 4 forwards; rank 1 warms up 2. Chunk c of rank r is stage c*pp + r.
  CHECK(megaplan::to_string(megaplan::interleaved_schedule(2, 2, 4, 2, 0)) ==
        "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3");
  CHECK(megaplan::to_string(megaplan::interleaved_schedule(2, 2, 4, 2, 1)) ==
        "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3");
}

TEST_CASE("interleaving refuses the shapes Megatron refuses", "[schedule][generators]") {
  CHECK_NOTHROW(megaplan::validate_interleaved_shape(4, 2, 8, 4, "--global-batch-size"));
  CHECK_THROWS_WITH(megaplan::validate_interleaved_shape(4, 2, 3, 4, "--global-batch-size"),
                    "--global-batch-size: the interleaved schedule needs pp <= microbatch group size <= "
                    "microbatches; got pp 4, group 4, 3 microbatches");
  CHECK_THROWS_WITH(megaplan::validate_interleaved_shape(4, 2, 8, 2, "--global-batch-size"),
                    Contains("got pp 4, group 2"));
  CHECK_THROWS_WITH(megaplan::validate_interleaved_shape(4, 1, 8, 4, "--global-batch-size"),
                    "--virtual-pipeline-model-parallel-size: the interleaved schedule needs vpp >= 2, got 1");
  CHECK_THROWS_WITH(megaplan::validate_interleaved_shape(1, 2, 8, 4, "--global-batch-size"),
                    "--pipeline-model-parallel-size: the interleaved schedule needs pp >= 2, got 1");
  // Megatron's remainder rule: pp 4, vpp 3, M 5, group 4 would leave a last group of 1 and hang
  // (8F4 -> 8B0 -> 7B0 -> 7F4); M 7 leaves 3 (refused), M 9 with group 5 leaves 4 (accepted).
  CHECK_THROWS_WITH(megaplan::validate_interleaved_shape(4, 3, 5, 4, "--global-batch-size"),
                    "--global-batch-size: the interleaved schedule needs microbatches % group size to be 0 or >= "
                    "pp; got 5 % 4 = 1 with pp 4");
  CHECK_THROWS_WITH(megaplan::validate_interleaved_shape(4, 2, 7, 4, "--global-batch-size"), Contains("7 % 4 = 3"));
  CHECK_NOTHROW(megaplan::validate_interleaved_shape(4, 2, 9, 5, "--global-batch-size"));
}

TEST_CASE("interleaved runs every (stage, microbatch) F and B once, F first", "[schedule][generators]") {
  for (int64_t pp = 2; pp <= 8; ++pp) {
    for (int64_t vpp = 2; vpp <= 4; ++vpp) {
      for (int64_t microbatches = pp; microbatches <= 32; ++microbatches) {
        for (int64_t rank = 0; rank < pp; ++rank) {
          INFO("pp " << pp << " vpp " << vpp << " M " << microbatches << " rank " << rank);
          const auto actions = megaplan::interleaved_schedule(pp, vpp, microbatches, pp, rank);
          REQUIRE(actions.size() == static_cast<std::size_t>(2 * vpp * microbatches));
          std::vector<int> forwards(static_cast<std::size_t>(vpp * pp * microbatches)), backwards(forwards.size());
          for (const megaplan::Action& action : actions) {
            REQUIRE(action.stage % pp == rank);
            const auto cell = static_cast<std::size_t>(action.stage * microbatches + action.microbatch);
            if (action.kind == megaplan::ActionKind::kForward)
              ++forwards[cell];
            else {
              REQUIRE(forwards[cell] == 1);
              ++backwards[cell];
            }
          }
          CHECK(std::count(forwards.begin(), forwards.end(), 1) == vpp * microbatches);
          CHECK(std::count(backwards.begin(), backwards.end(), 1) == vpp * microbatches);
        }
      }
    }
  }
}

TEST_CASE("next_stage_on_same_rank and rank_of_each_stage agree with rank_of_stage", "[schedule]") {
  using megaplan::StagePlacement;
  for (StagePlacement placement : {StagePlacement::kLoop, StagePlacement::kV}) {
    for (int64_t pp = 1; pp <= 9; ++pp) {
      for (int64_t stages_per_rank : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{9}}) {
        if (placement == StagePlacement::kV && stages_per_rank != 2) continue;
        const megaplan::ScheduleShape shape{pp, pp * stages_per_rank, 4, placement};
        const std::vector<int32_t> table = megaplan::rank_of_each_stage(shape);
        REQUIRE(table.size() == static_cast<std::size_t>(shape.num_stages));
        for (int64_t stage = 0; stage < shape.num_stages; ++stage) {
          CHECK(table[static_cast<std::size_t>(stage)] == shape.rank_of_stage(stage));
          if (stage + 1 < shape.num_stages) {
            CHECK(shape.next_stage_on_same_rank(stage) ==
                  (shape.rank_of_stage(stage + 1) == shape.rank_of_stage(stage)));
          }
        }
      }
    }
  }
}
