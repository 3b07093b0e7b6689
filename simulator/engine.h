// The discrete-event engine: replays a lowered schedule, one simulated GPU per pipeline rank (the
// members of a tensor-parallel group and the data-parallel replicas behave alike), each with a
// compute, a send, a receive and a data-parallel stream.
//
// Semantics, as the executor runs the same lists:
// - The host issues a rank's actions in order without waiting; each stream runs its actions in
//   that order, an action starting when its stream is free and core's dependencies() are met.
// - A SEND and its RECV form one transfer: it starts when both streams have reached them (NCCL's
//   rendezvous) and ends both after the transfer time. A send stream is held until then.
// - REDUCE_GRAD(s) reduces stage s's gradients bucket by bucket; a bucket may start once the
//   stage's last weight gradient (the last microbatch's backward) is its `ready` fraction done
//   (Megatron fills buckets during that backward). Without overlap (Megatron's default, local DDP)
//   every bucket waits for all of its rank's gradients.
//   A reduction is issued when its gradients are all computed (the latest one's end), and not
//   before the reduction ahead of it on the data-parallel stream. The compute it runs beside is
//   the work issued to the rank's compute stream by then: the actions whose dependencies were all
//   done strictly before that time (at a tie, the reduction is issued first). While buckets reduce
//   beside that work each side slows by the stage's gradient_reduction_overlap: a bucket takes
//   (1 + collective) times as long for the part of it beside that work, and the compute loses a
//   compute / (1 + compute) share of the time the buckets ran beside it, so its stream frees that
//   much later (the actions already issued keep their times).
// - OPTIM waits for everything before it on its rank (all streams), then steps.
// Every time is thus a longest path over the actions' dependencies and their streams' order, which
// the engine computes without an event queue: it advances each rank's streams as far as what is
// already known allows and looks at a rank again when a transfer another rank began makes more
// known; the compute stream issues the reductions between its actions where their times fall.
// The engine keeps no global state: simulations may run concurrently on several threads. Its parts,
// each with one job: the send/receive rendezvous (transfer_rendezvous.h), the gradient buckets
// (gradient_buckets.h) and the numbering of what it tracks (dependency_slots.h); engine.cc holds
// the streams and the accounting.
#pragma once

#include <cstdint>
#include <vector>

#include "core/schedule/schedule.h"
#include "core/timeline.h"
#include "simulator/gradient_buckets.h"
#include "simulator/overlap.h"

namespace megaplan::sim {

// Seconds for one microbatch on one virtual stage.
struct StageCosts {
  double forward = 0;               // F, with its tensor- and context-parallel collectives
  double backward = 0;              // B, with collectives and recomputation
  double backward_input = 0;        // I, with collectives and recomputation
  double backward_weight = 0;       // W
  double forward_collectives = 0;   // the part of `forward` spent in collectives
  double backward_collectives = 0;  // the part of `backward` and of `backward_input` spent in collectives
  double weight_collectives = 0;    // the part of `backward_weight` spent in collectives
  double send_forward = 0;          // transfer of the activation to stage s + 1
  double send_backward = 0;         // transfer of the input gradient to stage s - 1
  std::vector<GradientBucketCost> gradient_buckets;  // REDUCE_GRAD(s), in order
  // What those buckets and the rank's compute cost each other while they run at the same time.
  OverlapSlowdown gradient_reduction_overlap;
};

struct ActionCosts {
  std::vector<StageCosts> stages;             // one per virtual stage
  std::vector<double> optimizer;              // OPTIM per pipeline rank (with the distributed optimizer's gather)
  bool overlapped_gradient_reduction = true;  // --overlap-grad-reduce
};

struct RankSimulation {
  double compute_s = 0;             // compute stream busy, collectives excluded (OPTIM included)
  double collective_s = 0;          // tensor- and context-parallel collectives inside layers
  double pipeline_comm_s = 0;       // waiting on a transfer from another stage, once it has begun
  double data_parallel_comm_s = 0;  // waiting for gradient reduction before OPTIM
  double idle_s = 0;                // the rest: waiting for other stages (the bubble) and the tail
  double exposed_comm_s() const { return collective_s + pipeline_comm_s + data_parallel_comm_s; }
};

struct SimulationResult {
  double iteration_time_s = 0;  // the last OPTIM's end
  double pipeline_end_s = 0;    // the last F/B/I/W's end
  // Compute-stream idle time before pipeline_end over all ranks, as a fraction of pp x pipeline_end:
  // (p - 1) / (m + p - 1) for 1F1B with equal stages and free communication.
  double bubble_fraction = 0;
  std::vector<RankSimulation> ranks;
  int64_t events = 0;  // actions simulated, but the sends (each completes with its receive)
  Timeline timeline;   // filled when asked for
};

// REQUIRES: schedule.lowered and validate_schedule(schedule) passed; costs.stages has
// shape.num_stages entries and costs.optimizer one per pipeline rank.
SimulationResult simulate_schedule(const PipelineSchedule& schedule, const ActionCosts& costs, bool record_timeline);

}  // namespace megaplan::sim
