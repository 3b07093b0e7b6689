// The MPI bootstrap: MPI_Init_thread on first use, errors returned rather than fatal, one
// MPI_Bcast of the blob's size and one of its bytes. Part of the CUDA module (cuda_module.h): it
// bootstraps NCCL's worlds alone, so MPI is loaded with NCCL.
#include "executor/comm/mpi_bootstrap.h"

// MPI's C API only: without these mpi.h also declares the deprecated C++ bindings, whose library
// (libmpi_cxx) megaplan neither links nor wants.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "executor/cuda_module.h"

namespace megaplan::cuda_module {

namespace {

constexpr unsigned long long kMaxBlobBytes = 1 << 20;  // as the TCP rendezvous: an id, not data

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length));
}

void check(int code, int64_t rank, const char* call) {
  if (code != MPI_SUCCESS) {
    throw std::runtime_error("rank " + std::to_string(rank) + ": " + call + ": " + mpi_error_text(code));
  }
}

// Only the calling (main) thread talks to MPI, once: MPI_THREAD_FUNNELED is enough.
void initialise(int64_t rank) {
  int initialised = 0;
  check(MPI_Initialized(&initialised), rank, "MPI_Initialized");
  if (initialised) return;
  int provided = 0;
  check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), rank, "MPI_Init_thread");
  // A failed call returns its error here instead of aborting every rank without a message.
  check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), rank, "MPI_Comm_set_errhandler");
  std::atexit([] {
    int finalised = 0;
    if (MPI_Finalized(&finalised) == MPI_SUCCESS && !finalised) MPI_Finalize();
  });
}

}  // namespace

std::vector<uint8_t> mpi_broadcast_from_rank0(int64_t rank, int64_t world_size,
                                              const std::vector<uint8_t>& blob_on_rank0) {
  initialise(rank);
  int mpi_rank = 0, mpi_size = 0;
  check(MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank), rank, "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &mpi_size), rank, "MPI_Comm_size");
  if (mpi_rank != rank || mpi_size != world_size) {
    throw std::runtime_error("rank " + std::to_string(rank) + " of " + std::to_string(world_size) +
                             " by the launcher's environment is rank " + std::to_string(mpi_rank) + " of " +
                             std::to_string(mpi_size) + " in MPI_COMM_WORLD");
  }
  unsigned long long size = rank == 0 ? blob_on_rank0.size() : 0;
  check(MPI_Bcast(&size, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD), rank, "MPI_Bcast (size)");
  if (size > kMaxBlobBytes) {
    throw std::runtime_error("rank " + std::to_string(rank) + ": rank 0 broadcasts " + std::to_string(size) +
                             " bytes, more than the bootstrap's 1 MiB");
  }
  std::vector<uint8_t> blob = rank == 0 ? blob_on_rank0 : std::vector<uint8_t>(size);
  check(MPI_Bcast(blob.data(), static_cast<int>(size), MPI_BYTE, 0, MPI_COMM_WORLD), rank, "MPI_Bcast (blob)");
  return blob;
}

}  // namespace megaplan::cuda_module
