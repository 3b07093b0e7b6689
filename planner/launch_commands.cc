#include "planner/launch_commands.h"

#include <algorithm>

namespace megaplan::planner {

std::vector<LaunchCommand> launch_commands(const ParallelPlan& plan, const ClusterSpec& cluster,
                                           const std::string& job_file, const std::string& train_arguments) {
  const int64_t world = plan.world_size();
  const int64_t per_node = std::min(world, cluster.gpus_per_node);
  const int64_t nodes = (world + per_node - 1) / per_node;
  const std::string n = std::to_string(nodes), g = std::to_string(per_node), w = std::to_string(world);
  const std::string train =
      "megaplan train --plan " + job_file + " --device cuda" + (train_arguments.empty() ? "" : " " + train_arguments);
  const std::string where = nodes == 1 ? "on the node"
                                       : "on each of the " + n + " nodes, NODE_RANK 0.." + std::to_string(nodes - 1) +
                                             ", MASTER_ADDR the first";
  const std::string rendezvous = nodes == 1 ? "" : " --node-rank $NODE_RANK --master-addr $MASTER_ADDR";
  return {
      {"torchrun", where,
       "NCCL_NVLS_ENABLE=0 torchrun --nnodes " + n + " --nproc-per-node " + g + rendezvous +
           " --master-port 29500 --no-python " + train},
      {"megaplan launch", where,
       "megaplan launch --nnodes " + n + " --nproc-per-node " + g + rendezvous + " --master-port 29500 -- " +
           train.substr(std::string("megaplan ").size())},
      {"srun", "once, inside an allocation of " + n + " node(s) with " + g + " GPUs each",
       "MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1) MASTER_PORT=29500 "
       "NCCL_NVLS_ENABLE=0 srun --nodes " +
           n + " --ntasks-per-node " + g + " --gpus-per-node " + g + " " + train},
      {"mpirun", "once, with a host file of " + n + " node(s) of " + g + " slots (MASTER_ADDR the first)",
       "mpirun -np " + w + " --npernode " + g +
           " -x NCCL_NVLS_ENABLE=0 -x MASTER_ADDR=${MASTER_ADDR:-127.0.0.1} "
           "-x MASTER_PORT=29500 " +
           train},
  };
}

std::string format_launch_commands(const std::vector<LaunchCommand>& commands) {
  std::string text;
  for (const LaunchCommand& command : commands)
    text += "# " + command.launcher + ", " + command.note + "\n" + command.command + "\n";
  return text;
}

}  // namespace megaplan::planner
