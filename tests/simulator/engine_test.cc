// The engine against answers computable by hand: sums, pipeline bubbles, overlapped reductions.
#include <limits>

#include <catch2/catch.hpp>

#include "core/schedule/lowering.h"
#include "core/schedule/validation.h"
#include "simulator/engine.h"

using megaplan::ScheduleKind;
using megaplan::sim::ActionCosts;
using megaplan::sim::SimulationResult;

namespace {

// Buckets of these reduction times, the k-th of n whole when the backward is (k + 1) / n done.
std::vector<megaplan::sim::GradientBucketCost> filling_evenly(const std::vector<double>& seconds) {
  std::vector<megaplan::sim::GradientBucketCost> buckets;
  for (std::size_t k = 0; k < seconds.size(); ++k) {
    buckets.push_back({seconds[k], static_cast<double>(k + 1) / static_cast<double>(seconds.size())});
  }
  return buckets;
}

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
  const SimulationResult result =
      megaplan::sim::simulate_schedule(schedule, uniform_costs(schedule, 1.5, 3, 0, 0.25), true);
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
        const SimulationResult result =
            megaplan::sim::simulate_schedule(schedule, uniform_costs(schedule, 1, 2), false);
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
  CHECK(result.ranks[1].idle_s == Approx(1 + 2));                // F0 upstream, then after OPTIM until 7
  CHECK(result.ranks[0].exposed_comm_s() == Approx(0.5));        // the gradient's transfer
  CHECK(result.ranks[0].idle_s == Approx(0.5 + 1 + 2));          // the activation's transfer, F1, B1
}

TEST_CASE("gradient reduction hides behind a long backward and shows after a short one", "[simulator][engine]") {
  const auto schedule = lowered(ScheduleKind::kOneFOneB, 1, 1, 1);
  ActionCosts costs = uniform_costs(schedule, 1, 0);
  costs.stages[0].backward = 11;  // B runs from 1 to 12; four buckets fill at 3.75, 6.5, 9.25, 12
  costs.stages[0].gradient_buckets = filling_evenly({1, 1, 1, 1});
  SimulationResult result = megaplan::sim::simulate_schedule(schedule, costs, false);
  CHECK(result.iteration_time_s == Approx(13));  // only the last bucket is exposed
  CHECK(result.ranks[0].exposed_comm_s() == Approx(1));
  costs.stages[0].gradient_buckets = filling_evenly({5, 5, 5, 5});  // 3.75-8.75, -13.75, -18.75, -23.75
  result = megaplan::sim::simulate_schedule(schedule, costs, false);
  CHECK(result.iteration_time_s == Approx(23.75));
  CHECK(result.ranks[0].exposed_comm_s() == Approx(11.75));
}

TEST_CASE("compute beside a gradient reduction takes the measured fraction longer", "[simulator][engine]") {
  // B runs from 1 to 12 beside buckets of 1 s that fill as it goes. Slowed by 100% while they
  // overlap, it ends 1.5 s later, at 13.5 (three buckets, 3 s, beside it: 1.5 s of its work lost),
  // and its gradients fill the buckets over that longer time: at 4.125, 7.25, 10.375 and 13.5. The
  // last waits for the end and runs alone after it, to 14.5.
  const auto schedule = lowered(ScheduleKind::kOneFOneB, 1, 1, 1);
  ActionCosts costs = uniform_costs(schedule, 1, 0);
  costs.stages[0].backward = 11;
  costs.stages[0].gradient_buckets = filling_evenly({1, 1, 1, 1});
  costs.stages[0].gradient_reduction_overlap.compute = 1;
  const SimulationResult result = megaplan::sim::simulate_schedule(schedule, costs, false);
  CHECK(result.iteration_time_s == Approx(14.5));
  CHECK(result.ranks[0].compute_s == Approx(13.5));
  CHECK(result.ranks[0].exposed_comm_s() == Approx(1));
  CHECK(result.ranks[0].compute_s + result.ranks[0].idle_s + result.ranks[0].exposed_comm_s() ==
        Approx(result.iteration_time_s));
}

TEST_CASE("a bucket beside compute takes the measured fraction longer, and the compute loses that longer time",
          "[simulator][engine]") {
  // As above, with the buckets 50% longer beside the backward: the first three take 1.5 s each,
  // 4.5 s beside B, which at 100% slower loses 2.25 s and ends at 14.25; the last fills then and
  // takes 1 s alone, to 15.25.
  const auto schedule = lowered(ScheduleKind::kOneFOneB, 1, 1, 1);
  ActionCosts costs = uniform_costs(schedule, 1, 0);
  costs.stages[0].backward = 11;
  costs.stages[0].gradient_buckets = filling_evenly({1, 1, 1, 1});
  costs.stages[0].gradient_reduction_overlap = {1, 0.5};
  SimulationResult result = megaplan::sim::simulate_schedule(schedule, costs, false);
  CHECK(result.iteration_time_s == Approx(15.25));
  CHECK(result.ranks[0].compute_s == Approx(14.25));
  // A bucket that outlasts the compute runs stretched beside it and alone after it. 10 s buckets:
  // with B lengthened by x, the first fills at 1 + (11 + x) / 4 and runs beside B until 12 + x,
  // w = 8.25 + 0.75 x; B loses w / 2, so x = 6.6 and w = 13.2. The first bucket does w / 1.5 = 8.8
  // of its 10 s of work beside B and the rest alone, ending at 19.8; the others follow (49.8).
  costs.stages[0].gradient_buckets = filling_evenly({10, 10, 10, 10});
  result = megaplan::sim::simulate_schedule(schedule, costs, false);
  CHECK(result.iteration_time_s == Approx(49.8));
  CHECK(result.ranks[0].compute_s == Approx(12 + 6.6));
}

TEST_CASE("exposed_beside: the collective ends first, or the compute does and the rest runs alone",
          "[simulator][engine]") {
  using megaplan::sim::exposed_beside;
  // Nothing slows the collective: what 3 s of it beside longer compute adds, at 100% and at 25%.
  CHECK(exposed_beside(3, 11, {1, 0}) == Approx(1.5));
  CHECK(exposed_beside(3, 11, {0.25, 0}) == Approx(0.6));
  CHECK(exposed_beside(3, 1, {0.25, 0}) == Approx(2));  // the collective outlasts the compute
  CHECK(exposed_beside(3, 1, {0, 0}) == Approx(2));
  // Stretched 100%, 3 s take 6 beside compute of 11 at 25% slower: the compute loses 6 x 0.2.
  CHECK(exposed_beside(3, 11, {0.25, 1}) == Approx(1.2));
  // Compute of 2 s at 25% slower ends at 2.5, when the collective (100% slower) has done 1.25 s of
  // its 3; the other 1.75 s run alone: 4.25 in all, 2.25 more than the compute alone.
  CHECK(exposed_beside(3, 2, {0.25, 1}) == Approx(2.25));
  // Both sides at their boundary agree: collective x 2 = compute x 1.25.
  CHECK(exposed_beside(2.5, 4, {0.25, 1}) == Approx(1.0));
  CHECK(exposed_beside(2.5, 4, {0.25, 1}) == Approx(2.5 + 4 * 1.25 * 1 / 2 - 4));
  // Covered entirely (the parameter gathers beside a forward that outlasts them).
  CHECK(exposed_beside(3, std::numeric_limits<double>::infinity(), {0.25, 1}) == Approx(1.2));
}

TEST_CASE("without overlap every bucket waits for the rank's whole backward", "[simulator][engine]") {
  // Interleaved pp 2 vpp 2, 2 microbatches: rank 0 holds stages 0 and 2. Overlapped, stage 2's
  // buckets run beside stage 0's backwards; without (Megatron's default, local DDP) they start after
  // the rank's last backward, and the rank's buckets then run back to back.
  const auto schedule = lowered(ScheduleKind::kInterleaved, 2, 2, 2);
  ActionCosts costs = uniform_costs(schedule, 1, 2);
  for (auto& stage : costs.stages) stage.gradient_buckets = filling_evenly({1.5});
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
      for (const auto& [kind, vpp] :
           {std::pair{ScheduleKind::kGPipe, 1}, std::pair{ScheduleKind::kOneFOneB, 1},
            std::pair{ScheduleKind::kInterleaved, 2}, std::pair{ScheduleKind::kZeroBubbleH1, 1},
            std::pair{ScheduleKind::kZeroBubbleV, 2}, std::pair{ScheduleKind::kDualPipeV, 2}}) {
        if (kind == ScheduleKind::kInterleaved && (pp < 2 || microbatches < pp || microbatches % pp != 0)) continue;
        if (kind == ScheduleKind::kDualPipeV && microbatches < 2 * pp) continue;
        INFO(megaplan::to_string(kind) << " pp " << pp << " M " << microbatches);
        const auto schedule = lowered(kind, pp, vpp, microbatches);
        ActionCosts costs = uniform_costs(schedule, 1, 2, 0.1, 0.5);
        for (auto& stage : costs.stages) stage.gradient_buckets = filling_evenly({0.2, 0.2});
        const SimulationResult result = megaplan::sim::simulate_schedule(schedule, costs, true);
        std::size_t actions = 0;
        std::size_t sends = 0;
        for (const auto& rank : schedule.ranks) {
          actions += rank.size();
          for (const auto& action : rank) {
            sends +=
                action.kind == megaplan::ActionKind::kSendForward || action.kind == megaplan::ActionKind::kSendBackward;
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
