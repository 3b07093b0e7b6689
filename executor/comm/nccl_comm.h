// The NCCL implementation of Comm: one process per GPU, started by a launcher. A world is NCCL's
// communicator over every process, bootstrapped through rank 0's TCP rendezvous (tcp_rendezvous.h);
// the groups (tp, pp, dp, ...) are split from it.
//
// How it keeps comm.h's semantics, and where it chooses:
// - Streams. Every call records an event on the compute stream its communicator was split for
//   (the backend's compute_stream() at the call), makes a stream of the
//   group wait for it, runs the NCCL call on that stream and records a completion event after it;
//   request->wait() makes the compute stream wait for that event. Nothing blocks the host except
//   barrier(), which waits for its tiny all-reduce to finish.
// - A group is two NCCL communicators, each with its own stream: "up" carries the collectives and
//   every message from a lower to a higher group rank, "down" those going the other way. NCCL
//   runs one communicator's operations in issue order and a send does not finish before its
//   receive runs, so with a single communicator a rank that sends and then receives while its
//   peer does the same would wait forever (Megatron batches such pairs for this reason). Split by
//   direction, a send and the receive issued after it travel on different streams. A send still
//   waits for its receive on the GPU (only messages that fit NCCL's buffers finish earlier), and
//   the messages of one direction are served in issue order.
// - Reductions are NCCL's (ring or tree, fp32 accumulation for bf16): not in group-rank order, but
//   a run repeats on the same layout, machine and NCCL settings.
// - Failure. A watchdog thread per world polls NCCL's asynchronous error of every communicator and
//   the completion of every operation issued; an error, an operation unfinished after the world's
//   timeout, or a host call into NCCL (init, split, a first connection) blocked that long fails
//   the world: it records the first reason ("rank R: timed out after 10 min in all_reduce(1024
//   fp32, sum) on group dp [0, 1]", R the global rank), aborts every communicator (ncclCommAbort
//   ends their kernels, so streams waiting on them move on), and every later call and wait() throws
//   CommAborted with that reason. The host may be blocked where no exception can reach it (a
//   device synchronisation behind a kernel that never ends), so a failure the watchdog found ends
//   the process 10 s later unless the world is destroyed first, as torch's NCCL watchdog does: one
//   line "megaplan: <reason>" on stderr, then _exit(1). abort(reason), called by the program
//   itself, does not end the process.
// - The world owns every communicator and must outlive its Comms and their requests. Destroying
//   it finalises the communicators when every operation has completed and the world is healthy
//   (so the last messages reach the peers), and aborts them otherwise (a hung one would block).
// The header includes no CUDA header: built without CUDA, make_nccl_world() says so.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "executor/comm/comm.h"

namespace megaplan::exec {

class NcclWorld {
 public:
  virtual ~NcclWorld() = default;

  virtual int64_t rank() const = 0;
  virtual int64_t world_size() const = 0;

  // The communicator of this rank's group: a collective over the world (every rank calls it, in
  // the same order), ncclCommSplit's. Ranks passing the same `color` (>= 0) form one group, in
  // order of `key`: this rank's group rank is `key`, and `ranks` (the group's global ranks in that
  // order) and `label` ("tp", "dp", ...) name it in errors and global_ranks(). A rank in no group
  // passes color < 0 and gets null. Throws std::invalid_argument when ranks[key] is not this rank,
  // std::logic_error when NCCL's group disagrees with `ranks` (the ranks passed different lists),
  // CommAborted once the world failed. The communicator orders its operations after the work given
  // to the stream `compute_stream` names at each call (null or empty: the legacy default stream)
  // and that stream's later work after them in request->wait().
  virtual std::unique_ptr<Comm> split(int64_t color, int64_t key, const std::vector<int64_t>& ranks,
                                      const std::string& label, ComputeStream compute_stream) = 0;

  // Fails the world with `reason` (the first reason wins): every later call throws CommAborted,
  // and the watchdog aborts the communicators. Thread-safe; does not end the process.
  virtual void abort(const std::string& reason) = 0;
  virtual bool aborted() const = 0;
};

// How rank 0's NCCL unique id reaches every rank: given rank 0's bytes (read on rank 0 only),
// returns them on every rank. tcp_broadcast_from_rank0 at MASTER_ADDR:MASTER_PORT, or
// mpi_broadcast_from_rank0 under mpirun (launched_training.cc chooses).
using IdBroadcast = std::function<std::vector<uint8_t>(const std::vector<uint8_t>& blob_on_rank0)>;

// Bootstraps the world: selects GPU `device` for the calling thread, rank 0 makes NCCL's unique id,
// `broadcast` hands it to every rank, and ncclCommInitRank builds the world's communicator.
// `timeout` bounds, from then on, every operation (see the watchdog above).
// Throws SpecError("--device", ...) when megaplan was built without CUDA, its CUDA module cannot be
// loaded or no GPU is usable, SpecError("LOCAL_RANK", ...) when there is no GPU `device`, what
// `broadcast` throws, and std::runtime_error naming the NCCL call and its error when NCCL fails.
// REQUIRES: 0 <= rank < world_size; every rank passes the same world_size and a broadcast over
// the same world.
std::unique_ptr<NcclWorld> make_nccl_world(int64_t rank, int64_t world_size, int device, const IdBroadcast& broadcast,
                                           std::chrono::milliseconds timeout);

}  // namespace megaplan::exec
