// The communicators one rank trains with, built from core's Megatron rank groups by whichever Comm
// implementation runs the world (in-process threads, one GPU, NCCL): its pipeline, data-parallel
// and model-parallel (tp x pp) groups, the tied-embedding group of the ranks that hold stage 0
// and the last stage, and the world.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/parallel_plan.h"
#include "executor/comm/comm.h"

namespace megaplan::exec {

// Makes this rank's communicator of a group (global ranks in the group's order); every member of
// the group calls it with the same list and label.
using CommFactory = std::function<std::unique_ptr<Comm>(const std::vector<int64_t>& ranks, const std::string& label)>;

struct ParallelGroups {
  int64_t global_rank = 0;
  int64_t pipeline_rank = 0;
  int64_t data_parallel_rank = 0;
  int64_t tensor_parallel_rank = 0;
  // Null where the group has one member; `embedding` also where this rank holds neither end, or
  // one rank holds both (the output layer then reads the embedding itself). `world` holds every
  // rank (checkpoints meet on it).
  std::unique_ptr<Comm> world, pipeline, data_parallel, model_parallel, embedding;
};

// REQUIRES: validate_plan passed for plan; 0 <= global_rank < plan.world_size().
ParallelGroups make_parallel_groups(const ParallelPlan& plan, int64_t global_rank, const CommFactory& make);

}  // namespace megaplan::exec
