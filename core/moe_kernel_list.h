// The kernels of an MoE layer's MLP on one rank (executor/model/moe_mlp.h), call for call, at a
// load: how many rows the rank's dispatch sends each expert and how many rows its own experts
// compute. The experts' GEMMs (one per expert with rows), SwiGLU over their rows, the row moves
// under expert and tensor parallelism and the collectives' sizes all follow from it. The layer recipe lists them
// inside an MoE layer's blocks at the load a plan states (moe_stated_load); the kernel-list test
// drives the executor with a routing of that load and compares.
#pragma once

#include <cstdint>
#include <vector>

#include "core/kernel_list.h"
#include "core/layer_recipe.h"

namespace megaplan {

// Rows of one MoE layer's dispatch as one rank sees them.
struct MoeLoad {
  std::vector<int64_t> dispatched;  // the rank's own dispatch: rows for each of the layer's experts
  // Rows each sender sends each of the rank's experts, sender-major ([tp x ep x local experts]):
  // under expert parallelism the ep group's members (their dispatches to the rank), under tensor
  // parallelism every member of the rank's tp group as it gathers their arrived rows. Empty at
  // tp = ep = 1, where the rank's experts are all of them and compute its own dispatch.
  std::vector<int64_t> received;
  int64_t tensor_parallel = 1;  // the tp members `received` holds, outermost

  int64_t dispatched_rows() const;
  // Rows each of the rank's experts computes.
  std::vector<int64_t> local_rows(int64_t local_experts) const;
  int64_t expert_rows(int64_t local_experts) const;
  // The rows that arrive for tp member `member`'s share of the experts (all of them at tp 1), and the
  // most of any member: the room each member's rows are padded to before the tp group gathers them.
  int64_t room_rows(int64_t member) const;
  int64_t arrived_rows() const;
};

// The load a plan states: the busiest expert's rows `imbalance` times the mean (the trainer logs
// this max/mean as tokens_per_expert_max_mean; 1: balanced), the other experts sharing the rest
// evenly, an expert's rows capped by its capacity (every expert exactly that when padded). Every
// member of the ep and tp groups routes alike, and the rank described holds the busiest expert: its
// experts compute ep x tp times the rows its dispatch sends them, the rank the others wait for.
// REQUIRES: 1 <= imbalance <= experts / topk (the busiest expert takes at most every token).
MoeLoad moe_stated_load(const MoeDims& moe, double imbalance);

// A training forward's (which sums the router losses for the log), full recomputation's forward
// again (which does not) and the backward's; the
// collectives' bytes at `activation_bytes` an element.
MoeKernels moe_kernels(const MoeDims& moe, const MoeLoad& load, int64_t activation_bytes);

}  // namespace megaplan
