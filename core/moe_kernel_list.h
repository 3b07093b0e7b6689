// The kernels of an MoE layer's MLP on one rank (executor/model/moe_mlp.h), call for call, at a
// load: how many rows the rank's dispatch sends each expert and how many rows its own experts
// compute. The experts' GEMMs (one per expert with rows), SwiGLU over their rows, the row moves
// under expert parallelism and the exchanges' sizes all follow from it. The layer recipe lists them
// inside an MoE layer's blocks at the load a plan states (moe_stated_load); the kernel-list test
// drives the executor with a routing of that load and compares.
#pragma once

#include <cstdint>
#include <vector>

#include "core/kernel_list.h"
#include "core/layer_recipe.h"

namespace megaplan {

// Rows of one MoE layer's dispatch as one expert-parallel rank sees them.
struct MoeLoad {
  std::vector<int64_t> dispatched;  // the rank's own dispatch: rows for each of the layer's experts
  // Expert parallelism: rows each member of the ep group sends each of the rank's experts,
  // member-major ([ep x local experts]); empty at ep 1, where the rank's experts are all of them.
  std::vector<int64_t> received;

  int64_t dispatched_rows() const;
  // Rows each of the rank's experts computes.
  std::vector<int64_t> local_rows(int64_t local_experts) const;
  int64_t expert_rows(int64_t local_experts) const;
};

// The load a plan states: the busiest expert's rows `imbalance` times the mean (the trainer logs
// this max/mean as tokens_per_expert_max_mean; 1: balanced), the other experts sharing the rest
// evenly, an expert's rows capped by its capacity (every expert exactly that when padded). Every
// member of the ep group routes alike, and the rank described holds the busiest expert: its
// experts compute ep times the rows its dispatch sends them, the rank the others wait for.
// REQUIRES: 1 <= imbalance <= experts / topk (the busiest expert takes at most every token).
MoeLoad moe_stated_load(const MoeDims& moe, double imbalance);

// A training forward's (which sums the router losses for the log) and its backward's.
MoeKernels moe_kernels(const MoeDims& moe, const MoeLoad& load, int64_t activation_bytes);

}  // namespace megaplan
