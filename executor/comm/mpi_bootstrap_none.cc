// Built without MPI (without CUDA, or without Debian's libopenmpi-dev): the TCP rendezvous
// bootstraps every world.
#include "core/error.h"
#include "executor/comm/mpi_bootstrap.h"

namespace megaplan::exec {

bool mpi_bootstrap_available() { return false; }

std::vector<uint8_t> mpi_broadcast_from_rank0(int64_t, int64_t, const std::vector<uint8_t>&) {
  throw SpecError("--device",
                  "this megaplan was built without MPI (a CUDA build with Debian's libopenmpi-dev has it): "
                  "worlds bootstrap over the TCP rendezvous at MASTER_ADDR:MASTER_PORT");
}

}  // namespace megaplan::exec
