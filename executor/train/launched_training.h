// Training under a launcher (mpirun, srun, torchrun, `megaplan launch`): this process trains its
// one rank of the plan on its own GPU (the launcher's local rank), with the CUDA backend and NCCL
// communicators split from one world, as Megatron-LM's ranks do.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/model_spec.h"
#include "core/parallel_plan.h"
#include "executor/comm/comm.h"
#include "executor/comm/launch_environment.h"
#include "executor/train/parallel_groups.h"
#include "executor/train/trainer.h"

namespace megaplan::exec {

// Where rank 0's TCP rendezvous listens: the launcher's MASTER_ADDR, and MASTER_PORT or 29500
// (torch's and `megaplan launch`'s default). A world of one opens no socket, so it needs neither.
// (Under mpirun, when megaplan was built with MPI, NCCL's id travels over MPI instead and no
// address is needed: executor/comm/mpi_bootstrap.h.) torchrun's agent serves its own store on MASTER_PORT, and says so
// to its ranks with TORCHELASTIC_USE_AGENT_STORE=True (read through `getenv`): the rendezvous then takes the next port.
// Throws SpecError("MASTER_ADDR", ...) when a world of several has no MASTER_ADDR, SpecError("MASTER_PORT", ...) when
// there is no next port.
struct RendezvousAddress {
  std::string host;
  int port = 0;
};
RendezvousAddress rendezvous_address(const LaunchEnvironment& launch, const EnvironmentLookup& getenv);

// Makes a group like ncclCommSplit: a collective over the world; the ranks passing one color >= 0
// form a group, ordered by key; color < 0 gets null (see NcclWorld::split).
using SplitFunction = std::function<std::unique_ptr<Comm>(int64_t color, int64_t key, const std::vector<int64_t>& ranks,
                                                          const std::string& label)>;

// The CommFactory of global rank `rank` over a split. A kind of group where some group has two or
// more members is split by every rank (color: the index of its group, or none where this rank
// needs no communicator; key: its position in the group); a kind without such a group is not
// split at all. Every rank decides alike, since every rank sees the same groups, so every rank
// joins the same splits in the same order.
CommFactory split_comm_factory(int64_t rank, SplitFunction split);

// Trains rank launch.rank of `plan` on GPU launch.local_rank over NCCL (one process per GPU);
// the other ranks are the launcher's other processes. Rank 0 writes the log to `out`; the summary
// holds this rank's part (see train_rank).
// Throws what rendezvous_address (on this process's environment), make_nccl_world,
// make_cuda_backend and train_rank throw.
// REQUIRES: validate_plan(model, plan) passed; plan.world_size() == launch.world_size.
TrainSummary train_launched(const ModelSpec& model, const ParallelPlan& plan, const TrainOptions& options,
                            const LaunchEnvironment& launch, std::ostream& out);

}  // namespace megaplan::exec
