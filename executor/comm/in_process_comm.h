// The in-process implementations of Comm: every rank of a world is a thread of this process, so the
// runtime's parallel code paths (tp, pp, dp groups, their interleaving, failures and hangs) run in
// tests, on machines without GPUs, and on one GPU. Where the buffers live and how their bytes move
// is the world's InProcessMemory (in_process_memory.h): host memory by default ("in-process-cpu"),
// or every rank's buffers on GPU 0 (in_process_gpu_memory.h, "in-process-gpu"). Everything below
// holds for both; "copies", "computes" and "writes" are calls on the memory.
//
// How it keeps comm.h's semantics, and where it chooses:
// - A world (InProcessWorld) owns the shared state of every group built from it. A group is keyed
//   by its label and its global-rank list; every member passes the same list (in Megatron's order:
//   group rank = position in it) and the same label. Groups are independent: a thread may use its
//   tp, dp and pp communicators in any interleaving that keeps each group's own call order.
// - Collectives complete at the call on the host: each member deposits its buffers and a point of
//   its compute stream and blocks; the last to arrive checks that every member called the same
//   operation (else std::logic_error for it and an aborted world for the others), gives the group's
//   lane the result for every member (after every member's point), and releases them by advancing
//   the group's generation counter. request->wait() then orders the member's later work after the
//   lane's (nothing to wait for on the CPU). This is what NCCL does on a single stream (a collective
//   holds the stream until every member joins), so a program that hangs here would hang on a GPU
//   that issues collectives on its compute stream too.
// - Reductions run in increasing group-rank order, element by element, in float: the result equals
//   the sequential sum (or maximum) ((x0 op x1) op x2) ... bit for bit, on every member. bf16 inputs
//   are widened exactly, accumulated in float and rounded to nearest even ONCE, at the end (as NCCL's
//   fp32-accumulating reductions and the GPU kernels do; rounding at every step loses small terms).
//   The maximum propagates NaN; of equal values (+0 and -0) it keeps the lower rank's.
// - reduce_scatter and all_gather also accept NCCL's in-place layouts (output inside input at
//   rank() * count, or input inside output at rank() * count).
// - send is buffered: it copies the data into a staging buffer of the group's lane, puts that into
//   the (sender, receiver) mailbox of the group and returns (its wait() orders the sender's later
//   writes after the copy). recv returns at once; its wait() blocks until the message with the same
//   sequence number (the k-th recv from a peer takes the k-th send to it) has arrived, then copies
//   it out and gives the staging back. So a
//   rank may post recvs, then sends, then wait, as it may on a GPU, and waits may come in any
//   order. A count or type mismatch between the matched send and recv throws std::logic_error from
//   wait(), naming both. A recv request destroyed without wait() leaves its message unread (its
//   staging goes back with the world) and does not shift the matching of later recvs.
// - Failure: abort(reason) records the first reason, wakes every member blocked in any group of the
//   world, and makes them and every later call (and wait() on any request, even a complete one)
//   throw CommAborted(first reason). A member blocked longer than the world's timeout in one call or
//   wait() aborts the world with "rank R: timed out after T in OP on group LABEL [ranks]; ..." (R is
//   the global rank) and throws.
// - No global state: everything lives in the world, which must outlive its communicators and their
//   requests. A member may hold at most one live communicator per group.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "executor/comm/comm.h"
#include "executor/comm/in_process_memory.h"

namespace megaplan::exec {

namespace in_process {
struct GroupState;  // one group's collectives and mailboxes (in_process_comm.cc)
}

class InProcessWorld {
 public:
  // `timeout` bounds every single blocking wait (a collective, a recv's wait()). `memory` holds and
  // moves the members' bytes: host memory unless told otherwise.
  // REQUIRES: world_size > 0, timeout > 0 and memory non-null (std::invalid_argument otherwise).
  InProcessWorld(int64_t world_size, std::chrono::milliseconds timeout,
                 std::unique_ptr<InProcessMemory> memory = make_in_process_cpu_memory());
  ~InProcessWorld();
  InProcessWorld(const InProcessWorld&) = delete;
  InProcessWorld& operator=(const InProcessWorld&) = delete;

  int64_t world_size() const { return world_size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  InProcessMemory& memory() const { return *memory_; }

  // The communicator of global rank `global_rank` in the group `ranks` (global ranks, in the
  // group's order). `label` ("tp", "dp", "pp", "embedding"...) names the group in error messages
  // and tells apart groups with the same ranks (Megatron's dp and dp-cp when cp = 1).
  // `compute_stream` names the member's backend's compute stream: the communicator orders its work
  // after what the member gave that stream before each call, and the stream's later work after the
  // result in request->wait() (each asks it which stream that is at the time).
  // Throws std::invalid_argument when `ranks` is empty, repeats a rank, names one outside the world
  // or does not contain `global_rank`; std::logic_error when this member already holds a live
  // communicator for the group. Thread-safe.
  std::unique_ptr<Comm> group(int64_t global_rank, const std::vector<int64_t>& ranks, std::string label,
                              ComputeStream compute_stream = {});

  // Fails the world: see the header comment. The first reason wins; later calls change nothing.
  // Thread-safe; never blocks on a communicator.
  void abort(const std::string& reason);
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  // The first reason given to abort(); empty while the world is not aborted.
  std::string abort_reason() const;

 private:
  using GroupKey = std::pair<std::string, std::vector<int64_t>>;  // label, ranks

  int64_t world_size_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<InProcessMemory> memory_;  // before groups_: their unread messages give staging back to it
  mutable std::mutex mutex_;                 // guards groups_ and abort_reason_'s single write
  std::map<GroupKey, std::unique_ptr<in_process::GroupState>> groups_;
  std::string abort_reason_;  // written once, before aborted_ is set; read-only afterwards
  std::atomic<bool> aborted_{false};
};

}  // namespace megaplan::exec
