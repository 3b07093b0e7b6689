// A plan as the commands that start its ranks: `megaplan train --plan JOB` under torchrun, Slurm's
// srun, Open MPI's mpirun and megaplan's own launcher, one process per GPU.
#pragma once

#include <string>
#include <vector>

#include "core/cluster_spec.h"
#include "core/parallel_plan.h"

namespace megaplan::planner {

struct LaunchCommand {
  std::string launcher;  // "torchrun", "megaplan launch", "srun", "mpirun"
  std::string note;      // where and how often to run it
  std::string command;   // one shell line
};

// The plan's ranks laid over whole nodes of `cluster` (gpus_per_node processes per node, or fewer on
// a single node), each running `megaplan train --plan job_file` followed by `train_arguments`
// (the data and schedule flags the job file does not hold). NCCL_NVLS_ENABLE=0 is set for every
// rank, as megaplan's runs require.
std::vector<LaunchCommand> launch_commands(const ParallelPlan& plan, const ClusterSpec& cluster,
                                           const std::string& job_file, const std::string& train_arguments);

// Each command under a "# launcher, note" line.
std::string format_launch_commands(const std::vector<LaunchCommand>& commands);

}  // namespace megaplan::planner
