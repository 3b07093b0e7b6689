// The engine against answers computable by hand: sums, pipeline bubbles, overlapped reductions.
#include <catch2/catch.hpp>

#include "core/schedule/lowering.h"
#include "core/schedule/validation.h"
#include "simulator/engine.h"

using megaplan::ScheduleKind;
using megaplan::sim::ActionCosts;
using megaplan::sim::SimulationResult;

namespace {

megaplan::PipelineSchedule lowered(ScheduleKind kind, int64_t pp, int64_t vpp, int64_t microbatches) {
  megaplan::PipelineSchedule schedule =
      megaplan::lower_schedule(megaplan::generate_schedule(kind, pp, vpp, microbatches));
  megaplan::validate_schedule(schedule);
  return schedule;
}

// Every stage alike: forward f, backward b split evenly into I and W, messages `transfer`.
ActionCosts uniform_costs(const megaplan::PipelineSchedule& schedule, double f, double b, double transfer = 0,
                          double optimizer = 0) {
  ActionCosts costs;
  megaplan::sim::StageCosts stage;
  stage.forward = f;
  stage.backward = b;
  stage.backward_input = b / 2;
  stage.backward_weight = b / 2;
  stage.send_forward = transfer;
  stage.send_backward = transfer;
  costs.stages.assign(static_cast<std::size_t>(schedule.shape.num_stages), stage);
  costs.optimizer.assign(static_cast<std::size_t>(schedule.shape.pipeline_parallel_size), optimizer);
  return costs;
}

}  // namespace

TEST_CASE("one stage and one microbatch takes F + B + OPTIM", "[simulator][engine]") {
  const auto schedule = lowered(ScheduleKind::kOneFOneB, 1, 1, 1);
  const SimulationResult result = megaplan::sim::simulate_schedule(schedule, uniform_costs(schedule, 1.5, 3, 0, 0.25), true);
  CHECK(result.iteration_time_s == Approx(4.75));
  CHECK(result.pipeline_end_s == Approx(4.5));
  CHECK(result.bubble_fraction == Approx(0));
  REQUIRE(result.ranks.size() == 1);
  CHECK(result.ranks[0].compute_s == Approx(4.75));
  CHECK(result.ranks[0].idle_s == Approx(0).margin(1e-12));
}

TEST_CASE("1F1B and GPipe with equal stages have the bubble (p - 1) / (m + p - 1)", "[simulator][engine]") {
  for (ScheduleKind kind : {ScheduleKind::kOneFOneB, ScheduleKind::kGPipe}) {
    for (int64_t pp : {int64_t{2}, int64_t{4}, int64_t{8}}) {
      for (int64_t microbatches : {pp, 2 * pp, 4 * pp, int64_t{3}}) {
        INFO(megaplan::to_string(kind) << " pp " << pp << " M " << microbatches);
        const auto schedule = lowered(kind, pp, 1, microbatches);
        const SimulationResult result = megaplan::sim::simulate_schedule(schedule, uniform_costs(schedule, 1, 2), false);
        const double m = static_cast<double>(microbatches);
        const double p = static_cast<double>(pp);
        CHECK(result.pipeline_end_s == Approx((m + p - 1) * 3));
        CHECK(result.bubble_fraction == Approx((p - 1) / (m + p - 1)));
        for (const auto& rank : result.ranks) CHECK(rank.compute_s + rank.idle_s == Approx(result.iteration_time_s));
      }
    }
  }
}

TEST_CASE("interleaving divides the bubble by vpp", "[simulator][engine]") {
  for (int64_t pp : {2, 4}) {
    for (int64_t vpp : {2, 4}) {
      const int64_t microbatches = 2 * pp;
      INFO("pp " << pp << " vpp " << vpp);
      const auto schedule = lowered(ScheduleKind::kInterleaved, pp, vpp, microbatches);
      const double v = static_cast<double>(vpp);
      // Each chunk holds 1/vpp of the rank's layers.
      const SimulationResult result =
          megaplan::sim::simulate_schedule(schedule, uniform_costs(schedule, 1 / v, 2 / v), false);
      const double bubble = static_cast<double>(pp - 1) / v;
      const double m = static_cast<double>(microbatches);
      CHECK(result.pipeline_end_s == Approx((m + bubble) * 3));
      CHECK(result.bubble_fraction == Approx(bubble / (m + bubble)));
    }
  }
}

TEST_CASE("messages delay the next stage by the transfer time, and count as exposed", "[simulator][engine]") {
  // pp 2, M 1: F0 [0, 1], transfer [1, 1.5], F1 [1.5, 2.5], B1 [2.5, 4.5], transfer [4.5, 5],
  // B0 [5, 7]. Rank 1's OPTIM waits for its send to finish at 5.
  const auto schedule = lowered(ScheduleKind::kOneFOneB, 2, 1, 1);
  const SimulationResult result = megaplan::sim::simulate_schedule(schedule, uniform_costs(schedule, 1, 2, 0.5), true);
  CHECK(result.pipeline_end_s == Approx(7));
  CHECK(result.ranks[1].exposed_comm_s() == Approx(0.5 + 0.5));  // the activation's transfer, then its send
  CHECK(result.ranks[1].idle_s == Approx(1 + 2));              // F0 upstream, then after OPTIM until 7
  CHECK(result.ranks[0].exposed_comm_s() == Approx(0.5));         // the gradient's transfer
  CHECK(result.ranks[0].idle_s == Approx(0.5 + 1 + 2));         // the activation's transfer, F1, B1
}

TEST_CASE("gradient reduction hides behind a long backward and shows after a short one", "[simulator][engine]") {
  const auto schedule = lowered(ScheduleKind::kOneFOneB, 1, 1, 1);
  ActionCosts costs = uniform_costs(schedule, 1, 0);
  costs.stages[0].backward = 11;  // B runs from 1 to 12; four buckets fill at 3.75, 6.5, 9.25, 12
  costs.stages[0].gradient_buckets = {1, 1, 1, 1};
  SimulationResult result = megaplan::sim::simulate_schedule(schedule, costs, false);
  CHECK(result.iteration_time_s == Approx(13));  // only the last bucket is exposed
  CHECK(result.ranks[0].exposed_comm_s() == Approx(1));
  costs.stages[0].gradient_buckets = {5, 5, 5, 5};  // 3.75-8.75, -13.75, -18.75, -23.75
  result = megaplan::sim::simulate_schedule(schedule, costs, false);
  CHECK(result.iteration_time_s == Approx(23.75));
  CHECK(result.ranks[0].exposed_comm_s() == Approx(11.75));
}

TEST_CASE("compute beside a gradient reduction takes the measured fraction longer", "[simulator][engine]") {
  // B runs from 1 to 12 beside buckets [3.75, 4.75], [6.5, 7.5], [9.25, 10.25]: 3 s of overlap;
  // the last, [12, 13], runs after it. Slowed by 100% while they overlap, B does 1.5 s of its work
  // in those 3 s and ends 1.5 s later, at 13.5, after the last bucket: nothing of the reduction
  // shows, the compute is 1.5 s longer.
  const auto schedule = lowered(ScheduleKind::kOneFOneB, 1, 1, 1);
  ActionCosts costs = uniform_costs(schedule, 1, 0);
  costs.stages[0].backward = 11;
  costs.stages[0].gradient_buckets = {1, 1, 1, 1};
  costs.stages[0].gradient_reduction_slowdown = 1;
  const SimulationResult result = megaplan::sim::simulate_schedule(schedule, costs, false);
  CHECK(result.iteration_time_s == Approx(13.5));
  CHECK(result.ranks[0].compute_s == Approx(13.5));
  CHECK(result.ranks[0].exposed_comm_s() == Approx(0).margin(1e-12));
  CHECK(result.ranks[0].compute_s + result.ranks[0].idle_s + result.ranks[0].exposed_comm_s() ==
        Approx(result.iteration_time_s));
  // By the formula: what 3 s of a collective beside longer compute adds, at 100% and at 25%.
  CHECK(megaplan::sim::exposed_beside(3, 11, 1) == Approx(1.5));
  CHECK(megaplan::sim::exposed_beside(3, 11, 0.25) == Approx(0.6));
  CHECK(megaplan::sim::exposed_beside(3, 1, 0.25) == Approx(2));  // the collective outlasts the compute
  CHECK(megaplan::sim::exposed_beside(3, 1, 0) == Approx(2));
}

TEST_CASE("without overlap every bucket waits for the rank's whole backward", "[simulator][engine]") {
  // Interleaved pp 2 vpp 2, 2 microbatches: rank 0 holds stages 0 and 2. Overlapped, stage 2's
  // buckets run beside stage 0's backwards; without (Megatron's default, local DDP) they start after
  // the rank's last backward, and the rank's buckets then run back to back.
  const auto schedule = lowered(ScheduleKind::kInterleaved, 2, 2, 2);
  ActionCosts costs = uniform_costs(schedule, 1, 2);
  for (auto& stage : costs.stages) stage.gradient_buckets = {1.5};
  const SimulationResult overlapped = megaplan::sim::simulate_schedule(schedule, costs, false);
  costs.overlapped_gradient_reduction = false;
  const SimulationResult serial = megaplan::sim::simulate_schedule(schedule, costs, false);
  CHECK(serial.pipeline_end_s == Approx(overlapped.pipeline_end_s));
  // Rank 0 finishes the pipeline; then its two stages' buckets, 1.5 s each, back to back.
  CHECK(serial.iteration_time_s == Approx(serial.pipeline_end_s + 3));
  CHECK(overlapped.iteration_time_s < serial.iteration_time_s - 1);
  CHECK(serial.ranks[0].data_parallel_comm_s == Approx(3));
}

TEST_CASE("every generated schedule simulates to completion with one slice per action", "[simulator][engine]") {
  for (int64_t pp = 1; pp <= 4; ++pp) {
    for (int64_t microbatches = 1; microbatches <= 12; ++microbatches) {
      for (const auto& [kind, vpp] : {std::pair{ScheduleKind::kGPipe, 1}, std::pair{ScheduleKind::kOneFOneB, 1},
                                      std::pair{ScheduleKind::kInterleaved, 2}, std::pair{ScheduleKind::kZeroBubbleH1, 1},
                                      std::pair{ScheduleKind::kZeroBubbleV, 2}, std::pair{ScheduleKind::kDualPipeV, 2}}) {
        if (kind == ScheduleKind::kInterleaved && (pp < 2 || microbatches < pp || microbatches % pp != 0)) continue;
        if (kind == ScheduleKind::kDualPipeV && microbatches < 2 * pp) continue;
        INFO(megaplan::to_string(kind) << " pp " << pp << " M " << microbatches);
        const auto schedule = lowered(kind, pp, vpp, microbatches);
        ActionCosts costs = uniform_costs(schedule, 1, 2, 0.1, 0.5);
        for (auto& stage : costs.stages) stage.gradient_buckets = {0.2, 0.2};
        const SimulationResult result = megaplan::sim::simulate_schedule(schedule, costs, true);
        std::size_t actions = 0;
        std::size_t sends = 0;
        for (const auto& rank : schedule.ranks) {
          actions += rank.size();
          for (const auto& action : rank) {
            sends += action.kind == megaplan::ActionKind::kSendForward || action.kind == megaplan::ActionKind::kSendBackward;
          }
        }
        CHECK(result.timeline.slices.size() == actions);
        CHECK(result.events == static_cast<int64_t>(actions - sends));
        for (const auto& rank : result.ranks) {
          CHECK(rank.compute_s + rank.exposed_comm_s() + rank.idle_s == Approx(result.iteration_time_s));
        }
      }
    }
  }
}

// DualPipeV (issue 17): the rounds of the lowering once listed a middle rank's receives in the
// order its two peers happened to send, so a message needed later held up one needed now and the
// bubble doubled (31% against 1F1B's 15% at pp 4, M 64). Worked by hand for pp 2, M 4, F 1,
// B 2 (I 1, W 1) per stage, free messages, an OVERLAP_F_B taking F + B, the F's output leaving at
// its end: rank 0 runs 0F0-0F2 [0,3], 3F0 [3,4], 3I0 3W0 [4,6], 3F1 [6,7], (0F3;3B1) [7,10],
// (3F2;0B0) [11,14], 3B2 [14,16], (3F3;0B1) [17,20], 3B3 [20,22], 0I2 0W2 [22,24], 0I3 0W3
// [24,26]; rank 1 idles [0,1] and [21,22] and also ends at 26. 24 of 26 time units busy on each rank.
TEST_CASE("DualPipeV's bubble: a hand-worked case, and below 1F1B's on equal stages", "[simulator][engine]") {
  const auto v = lowered(ScheduleKind::kDualPipeV, 2, 2, 4);
  const SimulationResult small = megaplan::sim::simulate_schedule(v, uniform_costs(v, 1, 2), false);
  CHECK(small.pipeline_end_s == Approx(26));
  CHECK(small.bubble_fraction == Approx(4.0 / 52));
  // pp 4 and M >= 2 pp: DualPipeV's two chunks of half the layers against 1F1B's one of all of them.
  for (const int64_t microbatches : {8, 16, 64}) {
    INFO("M " << microbatches);
    const auto dual = lowered(ScheduleKind::kDualPipeV, 4, 2, microbatches);
    const auto one = lowered(ScheduleKind::kOneFOneB, 4, 1, microbatches);
    const SimulationResult d = megaplan::sim::simulate_schedule(dual, uniform_costs(dual, 1, 2), false);
    const SimulationResult o = megaplan::sim::simulate_schedule(one, uniform_costs(one, 2, 4), false);
    CHECK(d.bubble_fraction < o.bubble_fraction);
    CHECK(d.pipeline_end_s < o.pipeline_end_s);
  }
}
