// Who started this process: reads the rank and world size that mpirun (Open MPI), srun (Slurm) or
// torchrun (and `megaplan launch`, which sets torchrun's variables) put in the environment, so the
// distributed executor knows its place in the world before any communicator exists.
//
// Semantics:
// - Each launcher is recognised by its own set of variables, which must be complete:
//     mpirun    OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
//               OMPI_COMM_WORLD_LOCAL_SIZE
//     srun      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; the local size from
//               SLURM_TASKS_PER_NODE ("4(x2),3", this node's entry picked by SLURM_NODEID) or
//               else SLURM_NTASKS_PER_NODE
//     torchrun  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
//   A set of which some but not all are present is an error, not a guess.
// - Integers are plain decimal ("0", "17"): no sign, no leading zero, no hex, nothing that
//   overflows 64 bits. 0 <= rank < world size and 0 <= local rank < local size <= world size.
// - Two launchers' sets present at once must agree on rank and world size, else the process
//   refuses to start (it would otherwise join the wrong world). Where they agree, torchrun's wins.
//   Note: an sbatch script itself (no srun) carries SLURM_PROCID=0; a torchrun or mpirun started
//   from it sees Slurm's set as well and must unset it. `megaplan launch` strips it for its ranks.
// - MASTER_ADDR and MASTER_PORT (1..65535) name rank 0's TCP rendezvous; either may be absent.
// - No launcher's variables at all: launcher "none", rank 0 of 1.
// Every violation throws SpecError naming the variable, the rule and the values.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace megaplan::exec {

struct LaunchEnvironment {
  std::string launcher = "none";  // "mpirun", "srun", "torchrun" or "none"
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t local_rank = 0;        // this process's index among the ranks on its node
  int64_t local_world_size = 1;  // ranks on this node
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
};

// Looks a variable up; std::nullopt when it is not set (set but empty is "").
using EnvironmentLookup = std::function<std::optional<std::string>(const std::string&)>;

LaunchEnvironment detect_launch_environment(const EnvironmentLookup& getenv);
// The same, from this process's real environment.
LaunchEnvironment detect_launch_environment();

// Every variable detect_launch_environment reads (all launchers' sets, MASTER_ADDR, MASTER_PORT):
// what a launcher removes from its children's environment before setting its own.
const std::vector<std::string>& launch_environment_variables();

}  // namespace megaplan::exec
