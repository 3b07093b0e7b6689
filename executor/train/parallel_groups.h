// The communicators one rank trains with, built from core's Megatron rank groups by whichever Comm
// implementation runs the world (in-process threads, one GPU, NCCL): its pipeline, data-parallel
// tensor-parallel and model-parallel (tp x pp) groups, the tied-embedding group of the ranks that
// hold stage 0 and the last stage, the context-parallel group, the expert-parallel and expert
// data-parallel groups, and the world.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/model_spec.h"
#include "core/parallel_plan.h"
#include "core/parameter_list.h"
#include "executor/comm/comm.h"

namespace megaplan::exec {

// One kind of group (Megatron's tp, pp, dp, ...): every group of that kind over the world (disjoint
// lists of global ranks, each in its group's order) and which of them holds this rank.
struct GroupKind {
  std::string label;  // "world", "tp", "pp", "dp", "tp-pp", "embedding", "cp", "dp-cp", "ep", "expert-dp"
  std::vector<std::vector<int64_t>> groups;
  int64_t mine = -1;  // index into groups; -1: this rank is in none (the embedding group off the pipeline's ends)
};

// Whether this rank needs a communicator for the kind: it is in a group of two or more.
bool needs_communicator(const GroupKind& kind);

// Makes this rank's communicator of one kind of group, or null where !needs_communicator(kind).
// Every rank of the world calls it once per kind, in the same order (world, tp, pp, dp or dp-cp,
// tp-pp, embedding, cp when cp > 1, ep and expert-dp when ep > 1 or etp differs from tp, expert-tp
// when etp differs from tp), which NCCL's communicator split needs: it is a
// collective over the world.
using CommFactory = std::function<std::unique_ptr<Comm>(const GroupKind& kind)>;

struct ParallelGroups {
  int64_t global_rank = 0;
  int64_t pipeline_rank = 0;
  int64_t data_parallel_rank = 0;  // in the dp group: which samples the rank reads
  int64_t tensor_parallel_rank = 0;
  int64_t context_parallel_rank = 0;
  // The rank's place among the model's replicas, in Megatron's dp-cp group (the dp group when cp =
  // 1): replica 0 writes the checkpoint's files and the final weights.
  int64_t replica_rank = 0;
  // Under expert parallelism: which experts the rank holds (its place in the ep group), and its
  // place among their replicas (Megatron's expert data-parallel group: replica 0 writes them).
  int64_t expert_parallel_rank = 0;
  int64_t expert_replica_rank = 0;
  // Its place in the expert tensor-parallel group (which shard of its experts it holds).
  int64_t expert_tensor_parallel_rank = 0;
  // Whether the expert layers' groups differ from the dense layers' (ep > 1, or etp other than tp):
  // then the routed experts' gradients are summed over `expert_data_parallel` (null: one member).
  bool experts_apart = false;
  // Null where the group has one member; `embedding` also where this rank holds neither end, or
  // one rank holds both (the output layer then reads the embedding itself). `world` holds every
  // rank (checkpoints meet on it). `data_parallel` is Megatron's dp-cp group, the dp group when cp
  // = 1: gradients are summed and the distributed optimizer shards over it (the cp ranks each hold
  // a part of every sequence, so their gradients add up to the microbatch's).
  // `expert_parallel` and `expert_data_parallel` exist when experts_apart (and have two or more
  // members); `expert_tensor_parallel` when etp differs from tp (else the experts use `tensor_parallel`).
  std::unique_ptr<Comm> world, tensor_parallel, pipeline, data_parallel, model_parallel, embedding, context_parallel,
      expert_parallel, expert_data_parallel, expert_tensor_parallel;
};

// Whether this rank is the replica of `parameter` that writes it (its checkpoint directory, the
// final weights): replica 0 of the data-parallel group, or of the expert data-parallel group for a
// routed expert's.
inline bool writes_parameter(int64_t replica_rank, int64_t expert_replica_rank, const ParameterSpec& parameter) {
  return (parameter.expert ? expert_replica_rank : replica_rank) == 0;
}
inline bool writes_parameter(const ParallelGroups& groups, const ParameterSpec& parameter) {
  return writes_parameter(groups.replica_rank, groups.expert_replica_rank, parameter);
}

// REQUIRES: validate_plan passed for plan; 0 <= global_rank < plan.world_size().
ParallelGroups make_parallel_groups(const ParallelPlan& plan, int64_t global_rank, const CommFactory& make);

// Where a global rank sits in the plan's groups, as make_parallel_groups places it (no
// communicators): what a checkpoint's writers are named by and write (writes_parameter).
struct RankPlace {
  int64_t tensor_parallel_rank = 0, pipeline_rank = 0, expert_parallel_rank = 0, expert_tensor_parallel_rank = 0;
  int64_t replica_rank = 0, expert_replica_rank = 0;
};
// Every global rank's, in order. REQUIRES: validate_plan passed for plan.
std::vector<RankPlace> rank_places(const ParallelPlan& plan);
// The places of the ranks that write a checkpoint of `model` under `plan` (replica 0 of the
// data-parallel group, and replica 0 of the expert data-parallel group where the rank's stages hold
// experts: writes_parameter), by pipeline, tensor and expert rank. Each names one directory.
std::vector<RankPlace> checkpoint_writers(const ModelSpec& model, const ParallelPlan& plan);

}  // namespace megaplan::exec
