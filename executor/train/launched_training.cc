#include "executor/train/launched_training.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>

#include "core/error.h"
#include "executor/comm/mpi_bootstrap.h"
#include "executor/comm/nccl_comm.h"
#include "executor/comm/tcp_rendezvous.h"
#include "executor/runtime/cuda_backend.h"

namespace megaplan::exec {

namespace {

constexpr int kDefaultMasterPort = 29500;

}  // namespace

RendezvousAddress rendezvous_address(const LaunchEnvironment& launch, const EnvironmentLookup& getenv) {
  if (!launch.master_addr && launch.world_size > 1) {
    throw SpecError("MASTER_ADDR", launch.launcher + " started " + std::to_string(launch.world_size) +
                                       " processes but MASTER_ADDR is not set: rank 0's host must be named, with "
                                       "MASTER_PORT (default " +
                                       std::to_string(kDefaultMasterPort) + "), in every rank's environment");
  }
  RendezvousAddress address{launch.master_addr.value_or("127.0.0.1"), launch.master_port.value_or(kDefaultMasterPort)};
  if (getenv("TORCHELASTIC_USE_AGENT_STORE") == "True") {
    if (address.port == 65535) {
      throw SpecError("MASTER_PORT",
                      "torchrun's agent holds port 65535 and the rendezvous needs the next one: "
                      "pass torchrun a lower --master-port");
    }
    ++address.port;
  }
  return address;
}

CommFactory split_comm_factory(int64_t rank, SplitFunction split) {
  return [rank, split = std::move(split)](const GroupKind& kind) -> std::unique_ptr<Comm> {
    const bool split_by_all = std::any_of(kind.groups.begin(), kind.groups.end(),
                                          [](const std::vector<int64_t>& group) { return group.size() > 1; });
    if (!split_by_all) return nullptr;
    if (!needs_communicator(kind)) return split(-1, 0, {}, kind.label);
    const std::vector<int64_t>& group = kind.groups[static_cast<std::size_t>(kind.mine)];
    const int64_t position = std::find(group.begin(), group.end(), rank) - group.begin();
    return split(kind.mine, position, group, kind.label);
  };
}

TrainSummary train_launched(const ModelSpec& model, const ParallelPlan& plan, const TrainOptions& options,
                            const LaunchEnvironment& launch, std::ostream& out) {
  const EnvironmentLookup getenv = [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    return value ? std::optional<std::string>(value) : std::nullopt;
  };
  // NCCL's id travels over MPI under mpirun where megaplan has MPI (no MASTER_ADDR needed), else
  // over the TCP rendezvous.
  IdBroadcast broadcast;
  std::string bootstrap = "MPI";
  const std::chrono::milliseconds timeout = std::chrono::minutes(options.distributed_timeout_minutes);
  if (launch.launcher == "mpirun" && mpi_bootstrap_available()) {
    broadcast = [&launch](const std::vector<uint8_t>& blob) {
      return mpi_broadcast_from_rank0(launch.rank, launch.world_size, blob);
    };
  } else {
    const RendezvousAddress address = rendezvous_address(launch, getenv);
    bootstrap = "the TCP rendezvous at " + address.host + ":" + std::to_string(address.port);
    broadcast = [&launch, address, timeout](const std::vector<uint8_t>& blob) {
      return tcp_broadcast_from_rank0(launch.rank, launch.world_size, address.host, address.port, blob, timeout);
    };
  }
  (void)checked_train_options(options);  // before the world: its timeout comes from them
  // Declared before the world, so destroyed after it: the world's end aborts any NCCL kernel still
  // using the backend's buffers, which the backend's cudaFree would otherwise wait for.
  std::unique_ptr<Backend> backend;
  const std::unique_ptr<NcclWorld> world =
      make_nccl_world(launch.rank, launch.world_size, static_cast<int>(launch.local_rank), broadcast, timeout);
  if (launch.rank == 0) {
    out << "NCCL world of " << launch.world_size << " rank(s) from " << launch.launcher << ", bootstrapped over "
        << bootstrap << "\n";
  }
  backend = make_cuda_backend(plan.options.precision);  // on the GPU the world selected for this thread
  const ComputeStream stream = [compute = backend.get()] { return compute->compute_stream(); };
  const CommFactory make_comm = split_comm_factory(
      launch.rank,
      [&world, &stream](int64_t color, int64_t key, const std::vector<int64_t>& ranks, const std::string& label) {
        return world->split(color, key, ranks, label, stream);
      });
  return train_rank(model, plan, options, launch.rank, *backend, make_comm, out);
}

}  // namespace megaplan::exec
