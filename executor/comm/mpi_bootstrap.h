// NCCL's unique id over MPI, for worlds started by Open MPI's mpirun when megaplan was built with
// CUDA and MPI (Debian's libopenmpi-dev; optional: without it the TCP rendezvous at
// MASTER_ADDR:MASTER_PORT is the only way, see tcp_rendezvous.h). Over MPI no MASTER_ADDR is
// needed: mpirun already knows every rank. The header includes no MPI header; MPI is part of the
// CUDA module, with NCCL, its one user (cuda_module.h).
#pragma once

#include <cstdint>
#include <vector>

namespace megaplan::exec {

// Whether this megaplan was built with MPI (and CUDA, without which there is no NCCL world).
bool mpi_bootstrap_available();

// Rank 0's blob on every rank, by MPI_Bcast over MPI_COMM_WORLD. Initialises MPI on first use
// (finalised at exit) and checks that MPI's rank and size are the launcher's `rank` and
// `world_size`. Throws SpecError("--device", ...) when built without MPI or when the CUDA module
// cannot be loaded, std::runtime_error naming the MPI call and its error otherwise.
// REQUIRES: 0 <= rank < world_size.
std::vector<uint8_t> mpi_broadcast_from_rank0(int64_t rank, int64_t world_size,
                                              const std::vector<uint8_t>& blob_on_rank0);

}  // namespace megaplan::exec
