// Comm: one process group (Megatron's tp, pp, dp, dp-cp, tp-dp, embedding... groups, each built
// from core's rank groups) as the executor's runtime sees it. Three implementations sit behind it:
// ranks as threads of one process on the CPU (in_process_comm.h), ranks as threads sharing one GPU,
// and NCCL with one process per GPU. The runtime is written once against this interface.
//
// Semantics, the same for every implementation:
// - Buffers live where the backend keeps them (host memory for the CPU backend, device memory for
//   a GPU backend); `count` is in elements of `type`.
// - Ranks are group ranks: 0 .. size()-1, the position of the global rank in the group's list.
// - Collectives (all_reduce, reduce_scatter, all_gather, broadcast, barrier) are called by every
//   member in the same order. Reductions add (or take the maximum) in increasing group-rank order
//   wherever the implementation controls the order (the in-process ones always do), so a run
//   repeats bit for bit.
// - send/recv are matched per (sender, receiver) pair in call order, as NCCL matches them. A send
//   never blocks its caller until its receive is posted (lowered schedules assume a send runs on
//   its own stream), so a rank may send, then receive, while its peer does the same. (On a GPU
//   the send's own stream may wait for the receive; the NCCL implementation keeps each direction
//   of a pair on its own stream so that this cannot deadlock.)
// - Every call is asynchronous: it is ordered after the work the caller has already issued on its
//   compute stream (the one its ComputeStream names at the call) and returns a request;
//   request->wait() orders the caller's later compute after the operation (on a GPU, the compute
//   stream named at the wait, without blocking the host; on the CPU by blocking until it is done).
//   Buffers must stay valid, and inputs unchanged, until then.
// - Failure: when any rank of the world fails or a call waits longer than the world's timeout, every
//   blocked and later call on every communicator of that world throws CommAborted with the first
//   reason, so no rank hangs silently.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace megaplan::exec {

enum class ReduceOp : uint8_t { kSum, kMax };

// The stream a member issues its compute on (a cudaStream_t, as void* so that this header needs no
// CUDA; null where work runs synchronously on the host): its backend's compute_stream(), asked at
// every call and every wait rather than fixed when the group is made, because a rank issues on a
// second stream while an OVERLAP_F_B's pair overlaps (Backend::run_pair). An empty function means null.
using ComputeStream = std::function<void*()>;
// The stream `stream` names now: null where it is empty.
inline void* current_stream(const ComputeStream& stream) { return stream ? stream() : nullptr; }

// For error messages: "[0, 1, 2]" and "10 min" / "30 s" / "250 ms".
std::string rank_list(const std::vector<int64_t>& ranks);
std::string duration_text(std::chrono::milliseconds duration);

// Thrown by every communicator of a world once one rank failed or timed out; what() is the reason
// the first failing rank gave (e.g. "rank 3: data-path: ..." or "rank 1: timed out after 10 min
// in all_reduce on group tp [0, 1]").
class CommAborted : public std::runtime_error {
 public:
  explicit CommAborted(const std::string& reason) : std::runtime_error(reason) {}
};

// An operation in flight.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  // Orders the caller's later work after the operation (see the semantics above). Throws
  // CommAborted when the world was aborted before the operation finished.
  virtual void wait() = 0;
};
using Request = std::unique_ptr<CommRequest>;

// One request standing for two: wait() waits for the first, then the second.
Request both(Request first, Request second);
// One request standing for all of `requests` (at least one), waited for in order.
Request all_of(std::vector<Request> requests);
// Throws std::invalid_argument naming `group` unless `counts` has one entry per member.
void check_segment_counts(const std::vector<std::size_t>& counts, int64_t members, const std::string& group,
                          const char* which);

class Comm {
 public:
  virtual ~Comm() = default;
  // "in-process-cpu", "in-process-gpu" or "nccl", written into logs and traces.
  virtual std::string name() const = 0;
  virtual int64_t rank() const = 0;  // this member's group rank
  virtual int64_t size() const = 0;
  // The group's global ranks in its order (global_ranks()[rank()] is this process's or thread's).
  virtual const std::vector<int64_t>& global_ranks() const = 0;

  // To and from group rank `peer` (!= rank()).
  virtual Request send(const void* data, std::size_t count, DType type, int64_t peer) = 0;
  virtual Request recv(void* data, std::size_t count, DType type, int64_t peer) = 0;
  // A send to `to` and a receive from `from` as one operation, matched with the peers' own sends
  // and receives as the two apart would be (NCCL's grouped send and receive, torch's
  // batch_isend_irecv): ranks that exchange with each other at once, a ring's neighbours, cannot
  // hold each other up in their sends (NCCL's first send to a peer may wait on the host until that
  // peer receives on the same communicator). One request for both. `to` and `from` != rank().
  virtual Request send_recv(const void* send_data, int64_t to, void* recv_data, int64_t from, std::size_t count,
                            DType type) = 0;
  // Every member's segments to every member, own included, as one operation (MoE's token dispatch
  // and its return; NCCL's grouped sends and receives): `input` holds size() segments in group-rank
  // order, segment p of send_counts[p] elements for member p; `output` receives size() segments in
  // group-rank order, segment p of recv_counts[p] elements from member p. A pair's counts must agree
  // (recv_counts[r] on member p == send_counts[p] on member r: a dispatch learns them by exchanging
  // its counts first); segments may be empty. Matched per pair in call order with the pair's sends
  // and receives, like a send and a receive to and from each member. REQUIRES: both count lists
  // have size() entries.
  virtual Request all_to_all(const void* input, const std::vector<std::size_t>& send_counts, void* output,
                             const std::vector<std::size_t>& recv_counts, DType type) = 0;
  // In place: data = op over the members' data.
  virtual Request all_reduce(void* data, std::size_t count, DType type, ReduceOp op) = 0;
  // output[count] = op over the members' input[rank() * count .. (rank() + 1) * count).
  virtual Request reduce_scatter(const void* input, void* output, std::size_t count, DType type, ReduceOp op) = 0;
  // output[r * count ..] = member r's input[count], for every r.
  virtual Request all_gather(const void* input, void* output, std::size_t count, DType type) = 0;
  // data = the root member's data.
  virtual Request broadcast(void* data, std::size_t count, DType type, int64_t root) = 0;
  // Returns once every member has called it.
  virtual void barrier() = 0;
};

}  // namespace megaplan::exec
