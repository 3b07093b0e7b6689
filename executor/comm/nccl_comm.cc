// The NCCL world: bootstrap, groups split from it (two communicators and two streams each), the
// calls with their events, and the watchdog that fails the world (see nccl_comm.h).
//
// Locking. nccl_mutex_ is held by whoever calls into a communicator that may be in use: the
// caller's operations and splits, and the watchdog while it aborts them (ncclCommAbort frees the
// communicator, so no call may be inside it then). state_mutex_ guards what the watchdog reads:
// the groups, the operations in flight, the host call in progress and the failure. Order:
// nccl_mutex_ before state_mutex_. The watchdog polls ncclCommGetAsyncError without nccl_mutex_,
// as torch's does: that query is meant to run beside the operations.
//
// The watchdog calls no CUDA function that may wait for a lock of the driver: it queries events
// and never destroys them (the caller's thread does, at its next call). A thread blocked in a
// synchronisation behind a hung operation, the very case the watchdog is for, can hold such a lock
// (seen on 2 H200s: cudaEventDestroy in the watchdog waited on the rank's blocked cudaMemcpy, and
// nothing ended the process).
#include "executor/comm/nccl_comm.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>

#include "core/error.h"
#include "executor/cuda_module.h"

namespace megaplan::exec {
namespace {

using Clock = std::chrono::steady_clock;

// How often the watchdog looks, and how long a process whose world failed gets to end by itself
// before the watchdog's timer ends it.
constexpr std::chrono::milliseconds kPollInterval{100};
constexpr std::chrono::seconds kExitGrace{10};

ncclDataType_t nccl_type(DType type) {
  switch (type) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kFloat16: return ncclFloat16;
  }
  throw std::invalid_argument("nccl: unknown DType " + std::to_string(static_cast<int>(type)));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
  }
  throw std::invalid_argument("nccl: unknown ReduceOp " + std::to_string(static_cast<int>(op)));
}

// "unhandled system error (run with NCCL_DEBUG=INFO for details): <NCCL's last message>".
std::string nccl_error_text(ncclResult_t result, ncclComm_t comm) {
  std::string text = ncclGetErrorString(result);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') text += std::string(": ") + last;
  return text;
}

// A CUDA event for ordering and completion only. Shared by a request and the watchdog's list.
struct Event {
  Event() = default;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() {
    if (event) (void)cudaEventDestroy(event);  // released by CUDA once complete
  }
  cudaEvent_t event = nullptr;
};

// One NCCL communicator of a group and the stream its operations run on.
struct Lane {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

struct Group {
  std::string label;
  std::vector<int64_t> ranks;   // global ranks in group-rank order
  int64_t rank = 0;             // this process's group rank
  Lane up;                      // collectives, and messages from lower to higher group ranks
  Lane down;                    // messages from higher to lower group ranks
  ComputeStream compute;        // the stream this process's work on the group's buffers runs on now
  cudaEvent_t ready = nullptr;  // the compute stream at the latest call
  cudaStream_t compute_now() const { return static_cast<cudaStream_t>(current_stream(compute)); }
  float* scratch = nullptr;  // barrier's one element, on up.stream
  std::string name() const { return "group " + label + " " + rank_list(ranks); }
};

// An operation issued and not yet seen complete by the watchdog.
struct InFlight {
  std::shared_ptr<Event> done;
  std::string what;
  Clock::time_point issued;
};

using NcclCall = std::function<ncclResult_t(ncclComm_t, cudaStream_t)>;

// Ends the process kExitGrace after a failure the watchdog found, unless cancelled first (the
// world was destroyed: the process is moving on). A thread of its own, so that a watchdog stuck in
// ncclCommAbort cannot hold the end back; detached, so it outlives nothing it reads.
class ExitTimer {
 public:
  explicit ExitTimer(const std::string& reason) : state_(std::make_shared<State>()) {
    std::thread([state = state_, line = "megaplan: " + reason + "\n"] {
      std::unique_lock<std::mutex> lock(state->mutex);
      if (state->changed.wait_for(lock, kExitGrace, [&] { return state->cancelled; })) return;
      std::fputs(line.c_str(), stderr);
      std::fflush(stderr);
      ::_exit(1);
    }).detach();
  }
  void cancel() {
    {
      const std::lock_guard<std::mutex> lock(state_->mutex);
      state_->cancelled = true;
    }
    state_->changed.notify_all();
  }

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable changed;
    bool cancelled = false;
  };
  std::shared_ptr<State> state_;
};

class World final : public NcclWorld {
 public:
  World(int64_t rank, int64_t world_size, int device, const IdBroadcast& broadcast, std::chrono::milliseconds timeout);
  ~World() override;
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int64_t rank() const override { return rank_; }
  int64_t world_size() const override { return world_size_; }
  std::unique_ptr<Comm> split(int64_t color, int64_t key, const std::vector<int64_t>& ranks, const std::string& label,
                              ComputeStream compute_stream) override;
  void abort(const std::string& reason) override;
  bool aborted() const override { return aborted_.load(std::memory_order_acquire); }
  void select_device() const;  // the world's GPU for the calling thread

  // For the communicators and their requests. `what` names the operation and its group in errors.
  std::shared_ptr<Event> issue(Group& group, bool down, const std::string& what, const NcclCall& call);
  void order_compute_after(const Group& group, const Event& done, const std::string& what);  // Request::wait
  void wait_on_host(const Event& done, const std::string& what);                             // barrier
  [[noreturn]] void throw_aborted() const { throw CommAborted(abort_reason()); }

 private:
  std::string abort_reason() const;
  // Records the first failure (returns whether this was it) and wakes the watchdog.
  bool fail(const std::string& reason);
  [[noreturn]] void fail_and_throw(const std::string& reason);
  void check_cuda(cudaError_t status, const std::string& what);
  void throw_if_aborted() const {
    if (aborted()) throw_aborted();
  }
  // A blocking host call into NCCL, watched for the timeout. REQUIRES: nccl_mutex_ held.
  ncclResult_t host_call(const std::string& what, const std::function<ncclResult_t()>& call);
  void watch();
  std::string find_failure_locked();  // REQUIRES: state_mutex_ held
  bool abort_communicators();
  bool all_complete();
  void stop_watchdog();
  void release(bool finalized);  // destroys (finalized) or aborts every communicator, frees the rest

  const int64_t rank_;
  const int64_t world_size_;
  const int device_;
  const std::chrono::milliseconds timeout_;
  ncclComm_t world_comm_ = nullptr;  // the parent of every group, never used for operations

  std::timed_mutex nccl_mutex_;
  mutable std::mutex state_mutex_;
  std::condition_variable wake_;               // the watchdog: a failure, or stop
  std::deque<std::unique_ptr<Group>> groups_;  // stable addresses; added under both mutexes
  std::deque<InFlight> in_flight_;
  std::vector<std::shared_ptr<Event>> finished_;  // seen complete; destroyed by the caller's thread
  std::optional<std::pair<std::string, Clock::time_point>> host_call_;  // what, since when
  std::string reason_;  // the first failure; written once, before aborted_ is set
  std::atomic<bool> aborted_{false};
  bool communicators_aborted_ = false;
  bool stopping_ = false;
  std::optional<ExitTimer> exit_timer_;  // armed by a failure the watchdog found
  std::thread watchdog_;
};

class NcclRequest final : public CommRequest {
 public:
  NcclRequest(World& world, const Group& group, std::shared_ptr<Event> done, std::string what)
      : world_(world), group_(group), done_(std::move(done)), what_(std::move(what)) {}
  void wait() override { world_.order_compute_after(group_, *done_, what_); }

 private:
  World& world_;
  const Group& group_;
  std::shared_ptr<Event> done_;
  std::string what_;
};

class NcclComm final : public Comm {
 public:
  NcclComm(World& world, Group& group) : world_(world), group_(group) {}

  std::string name() const override { return "nccl"; }
  int64_t rank() const override { return group_.rank; }
  int64_t size() const override { return static_cast<int64_t>(group_.ranks.size()); }
  const std::vector<int64_t>& global_ranks() const override { return group_.ranks; }

  Request send(const void* data, std::size_t count, DType type, int64_t peer) override {
    check_peer(peer, "send");
    check_buffer(data, count, "send");
    const std::string what = "send(" + counted(count, type) + ") to rank " + global(peer) + on();
    return issue(peer < group_.rank, what, [=](ncclComm_t comm, cudaStream_t stream) {
      return ncclSend(data, count, nccl_type(type), static_cast<int>(peer), comm, stream);
    });
  }
  Request recv(void* data, std::size_t count, DType type, int64_t peer) override {
    check_peer(peer, "recv");
    check_buffer(data, count, "recv");
    const std::string what = "recv(" + counted(count, type) + ") from rank " + global(peer) + on();
    // The sender's direction: a lower peer sends up.
    return issue(peer > group_.rank, what, [=](ncclComm_t comm, cudaStream_t stream) {
      return ncclRecv(data, count, nccl_type(type), static_cast<int>(peer), comm, stream);
    });
  }
  // One NCCL group on the upward lane: both connections are made, and both transfers run, in one
  // call, whatever the peers (a ring's two neighbours, or one peer both ways). The group's own
  // sends and receives keep to their lanes; a group's exchanges all go this way.
  Request send_recv(const void* send_data, int64_t to, void* recv_data, int64_t from, std::size_t count,
                    DType type) override {
    check_peer(to, "send_recv");
    check_peer(from, "send_recv");
    check_buffer(send_data, count, "send_recv");
    check_buffer(recv_data, count, "send_recv");
    const std::string what =
        "send_recv(" + counted(count, type) + ") to rank " + global(to) + " from rank " + global(from) + on();
    return issue(false, what, [=](ncclComm_t comm, cudaStream_t stream) {
      ncclResult_t result = ncclGroupStart();
      if (result != ncclSuccess) return result;
      const ncclResult_t sent = ncclSend(send_data, count, nccl_type(type), static_cast<int>(to), comm, stream);
      const ncclResult_t received = ncclRecv(recv_data, count, nccl_type(type), static_cast<int>(from), comm, stream);
      result = ncclGroupEnd();  // ends the group whatever the calls in it returned
      return sent != ncclSuccess ? sent : received != ncclSuccess ? received : result;
    });
  }
  // Each segment a grouped send and receive, the member's own included (NCCL sends to itself within
  // a group); empty segments are left out.
  Request all_to_all(const void* input, const std::vector<std::size_t>& send_counts, void* output,
                     const std::vector<std::size_t>& recv_counts, DType type) override {
    check_segment_counts(send_counts, size(), group_.name(), "send_counts");
    check_segment_counts(recv_counts, size(), group_.name(), "recv_counts");
    std::size_t sent = 0, received = 0;
    for (std::size_t count : send_counts) sent += count;
    for (std::size_t count : recv_counts) received += count;
    check_buffer(input, sent, "all_to_all");
    check_buffer(output, received, "all_to_all");
    const std::string what = "all_to_all(" + counted(sent, type) + " out, " + counted(received, type) + " in)" + on();
    return issue(false, what, [=](ncclComm_t comm, cudaStream_t stream) {
      const std::size_t element = dtype_bytes(type);
      ncclResult_t first = ncclGroupStart();
      if (first != ncclSuccess) return first;
      std::size_t send_offset = 0, recv_offset = 0;
      for (std::size_t peer = 0; peer < send_counts.size(); ++peer) {
        const ncclResult_t result_send =
            send_counts[peer] == 0 ? ncclSuccess
                                   : ncclSend(static_cast<const char*>(input) + send_offset * element,
                                              send_counts[peer], nccl_type(type), static_cast<int>(peer), comm, stream);
        const ncclResult_t result_recv =
            recv_counts[peer] == 0 ? ncclSuccess
                                   : ncclRecv(static_cast<char*>(output) + recv_offset * element, recv_counts[peer],
                                              nccl_type(type), static_cast<int>(peer), comm, stream);
        if (first == ncclSuccess) first = result_send != ncclSuccess ? result_send : result_recv;
        send_offset += send_counts[peer];
        recv_offset += recv_counts[peer];
      }
      const ncclResult_t ended = ncclGroupEnd();  // ends the group whatever the calls in it returned
      return first != ncclSuccess ? first : ended;
    });
  }
  Request all_reduce(void* data, std::size_t count, DType type, ReduceOp op) override {
    check_buffer(data, count, "all_reduce");
    const std::string what = "all_reduce(" + counted(count, type) + ", " + op_name(op) + ")" + on();
    return issue(false, what, [=](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllReduce(data, data, count, nccl_type(type), nccl_op(op), comm, stream);
    });
  }
  Request reduce_scatter(const void* input, void* output, std::size_t count, DType type, ReduceOp op) override {
    check_buffer(input, count, "reduce_scatter");
    check_buffer(output, count, "reduce_scatter");
    const std::string what = "reduce_scatter(" + counted(count, type) + ", " + op_name(op) + ")" + on();
    return issue(false, what, [=](ncclComm_t comm, cudaStream_t stream) {
      return ncclReduceScatter(input, output, count, nccl_type(type), nccl_op(op), comm, stream);
    });
  }
  Request all_gather(const void* input, void* output, std::size_t count, DType type) override {
    check_buffer(input, count, "all_gather");
    check_buffer(output, count, "all_gather");
    const std::string what = "all_gather(" + counted(count, type) + ")" + on();
    return issue(false, what, [=](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllGather(input, output, count, nccl_type(type), comm, stream);
    });
  }
  Request broadcast(void* data, std::size_t count, DType type, int64_t root) override {
    if (root < 0 || root >= size()) {
      throw std::invalid_argument("broadcast on " + group_.name() + ": root " + std::to_string(root) +
                                  " is not a group rank");
    }
    check_buffer(data, count, "broadcast");
    const std::string what = "broadcast(" + counted(count, type) + ", root " + global(root) + ")" + on();
    return issue(false, what, [=](ncclComm_t comm, cudaStream_t stream) {
      return ncclBroadcast(data, data, count, nccl_type(type), static_cast<int>(root), comm, stream);
    });
  }
  void barrier() override {
    const std::string what = "barrier" + on();
    float* scratch = group_.scratch;
    // The maximum of zeros stays zero: the scratch never overflows however often it is reduced.
    const std::shared_ptr<Event> done = world_.issue(group_, false, what, [=](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllReduce(scratch, scratch, 1, ncclFloat32, ncclMax, comm, stream);
    });
    world_.wait_on_host(*done, what);
  }

 private:
  Request issue(bool down, const std::string& what, const NcclCall& call) {
    return std::make_unique<NcclRequest>(world_, group_, world_.issue(group_, down, what, call), what);
  }
  std::string on() const { return " on " + group_.name(); }
  std::string global(int64_t group_rank) const {
    return std::to_string(group_.ranks[static_cast<std::size_t>(group_rank)]);
  }
  static std::string counted(std::size_t count, DType type) { return std::to_string(count) + " " + to_string(type); }
  static const char* op_name(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : "max"; }
  void check_peer(int64_t peer, const char* operation) const {
    if (peer < 0 || peer >= size() || peer == group_.rank) {
      throw std::invalid_argument(std::string(operation) + " on " + group_.name() + ": peer " + std::to_string(peer) +
                                  " is not another group rank of group rank " + std::to_string(group_.rank));
    }
  }
  void check_buffer(const void* data, std::size_t count, const char* operation) const {
    if (data == nullptr && count > 0) {
      throw std::invalid_argument(std::string(operation) + " on " + group_.name() + ": null buffer for " +
                                  std::to_string(count) + " elements");
    }
  }

  World& world_;
  Group& group_;
};

World::World(int64_t rank, int64_t world_size, int device, const IdBroadcast& broadcast,
             std::chrono::milliseconds timeout)
    : rank_(rank), world_size_(world_size), device_(device), timeout_(timeout) {
  if (world_size <= 0 || rank < 0 || rank >= world_size || world_size > INT_MAX) {
    throw std::invalid_argument("NcclWorld: rank " + std::to_string(rank) + " of a world of " +
                                std::to_string(world_size));
  }
  if (timeout <= std::chrono::milliseconds(0)) throw std::invalid_argument("NcclWorld: the timeout must be positive");
  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  if (counted != cudaSuccess || count == 0) {
    throw SpecError("--device", std::string("no usable CUDA GPU: ") +
                                    (counted != cudaSuccess ? cudaGetErrorString(counted) : "none present"));
  }
  if (device < 0 || device >= count) {
    throw SpecError("LOCAL_RANK", "local rank " + std::to_string(device) + " drives GPU " + std::to_string(device) +
                                      " but this process sees " + std::to_string(count) +
                                      " GPU(s): start at most that many ranks per node "
                                      "(or check CUDA_VISIBLE_DEVICES)");
  }
  select_device();

  watchdog_ = std::thread([this] { watch(); });
  try {
    ncclUniqueId id{};
    std::vector<uint8_t> blob;
    if (rank == 0) {
      const ncclResult_t made = ncclGetUniqueId(&id);
      if (made != ncclSuccess) throw std::runtime_error("rank 0: ncclGetUniqueId: " + nccl_error_text(made, nullptr));
      blob.assign(reinterpret_cast<const uint8_t*>(&id), reinterpret_cast<const uint8_t*>(&id) + sizeof id);
    }
    blob = broadcast(blob);
    if (blob.size() != sizeof id) {
      throw std::runtime_error("rank " + std::to_string(rank) + ": rank 0 sent a " + std::to_string(blob.size()) +
                               "-byte NCCL id, not " + std::to_string(sizeof id));
    }
    std::memcpy(&id, blob.data(), sizeof id);
    const std::lock_guard<std::timed_mutex> nccl(nccl_mutex_);
    const std::string what = "ncclCommInitRank for a world of " + std::to_string(world_size);
    const ncclResult_t made = host_call(
        what, [&] { return ncclCommInitRank(&world_comm_, static_cast<int>(world_size), id, static_cast<int>(rank)); });
    if (made != ncclSuccess) {
      world_comm_ = nullptr;
      throw std::runtime_error("rank " + std::to_string(rank) + ": " + what + ": " + nccl_error_text(made, nullptr));
    }
  } catch (...) {
    stop_watchdog();
    release(false);
    throw;
  }
}

World::~World() {
  // A healthy world finalises under the watchdog's eye (ncclCommFinalize flushes the last
  // messages to the peers and may wait for them); otherwise abort, which never waits.
  bool finalized = !aborted() && all_complete();
  if (finalized) {
    const std::lock_guard<std::timed_mutex> nccl(nccl_mutex_);
    std::vector<std::pair<ncclComm_t, std::string>> comms;
    for (const auto& group : groups_) {
      comms.emplace_back(group->up.comm, group->name());
      comms.emplace_back(group->down.comm, group->name());
    }
    comms.emplace_back(world_comm_, "the world");
    for (const auto& [comm, name] : comms) {
      if (comm == nullptr) continue;
      if (host_call("ncclCommFinalize of " + name, [comm = comm] { return ncclCommFinalize(comm); }) != ncclSuccess) {
        finalized = false;
        break;
      }
    }
  }
  stop_watchdog();
  release(finalized);
}

void World::select_device() const {
  const cudaError_t status = cudaSetDevice(device_);
  if (status != cudaSuccess) {
    throw SpecError("--device", "cannot use GPU " + std::to_string(device_) + ": " + cudaGetErrorString(status));
  }
}

std::unique_ptr<Comm> World::split(int64_t color, int64_t key, const std::vector<int64_t>& ranks,
                                   const std::string& label, ComputeStream compute_stream) {
  const std::string name = "group " + label + " " + rank_list(ranks);
  if (color > INT_MAX) {
    throw std::invalid_argument("split of " + name + ": color " + std::to_string(color) + " > INT_MAX");
  }
  if (color >= 0 &&
      (key < 0 || key >= static_cast<int64_t>(ranks.size()) || ranks[static_cast<std::size_t>(key)] != rank_)) {
    throw std::invalid_argument("split of " + name + ": rank " + std::to_string(rank_) + " is not at position " +
                                std::to_string(key));
  }
  const std::lock_guard<std::timed_mutex> nccl(nccl_mutex_);
  throw_if_aborted();
  const int nccl_color = color < 0 ? NCCL_SPLIT_NOCOLOR : static_cast<int>(color);
  const int nccl_key = color < 0 ? 0 : static_cast<int>(key);
  auto group = std::make_unique<Group>();
  group->label = label;
  group->ranks = ranks;
  group->rank = key;
  for (ncclComm_t* comm : {&group->up.comm, &group->down.comm}) {
    const ncclResult_t made = host_call(
        "ncclCommSplit for " + name, [&] { return ncclCommSplit(world_comm_, nccl_color, nccl_key, comm, nullptr); });
    if (made != ncclSuccess) {
      *comm = nullptr;
      if (group->up.comm) (void)ncclCommAbort(group->up.comm);
      fail_and_throw("rank " + std::to_string(rank_) + ": ncclCommSplit for " + name + ": " +
                     nccl_error_text(made, world_comm_));
    }
  }
  if (color < 0) return nullptr;

  int nccl_size = 0, nccl_rank = 0;
  (void)ncclCommCount(group->up.comm, &nccl_size);
  (void)ncclCommUserRank(group->up.comm, &nccl_rank);
  if (nccl_size != static_cast<int>(ranks.size()) || nccl_rank != nccl_key) {
    (void)ncclCommAbort(group->up.comm);
    (void)ncclCommAbort(group->down.comm);
    throw std::logic_error("ncclCommSplit for " + name + ": NCCL's group has " + std::to_string(nccl_size) +
                           " ranks with rank " + std::to_string(rank_) + " at " + std::to_string(nccl_rank) +
                           ": the ranks passed different group lists");
  }
  Group& added = *group;
  added.compute = std::move(compute_stream);
  {
    // From here on the cleanup owns the communicators and whatever was created beside them.
    const std::lock_guard<std::mutex> state(state_mutex_);
    groups_.push_back(std::move(group));
  }
  check_cuda(cudaStreamCreateWithFlags(&added.up.stream, cudaStreamNonBlocking), "cudaStreamCreate for " + name);
  check_cuda(cudaStreamCreateWithFlags(&added.down.stream, cudaStreamNonBlocking), "cudaStreamCreate for " + name);
  check_cuda(cudaEventCreateWithFlags(&added.ready, cudaEventDisableTiming), "cudaEventCreate for " + name);
  check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&added.scratch), sizeof(float), added.up.stream),
             "cudaMallocAsync for " + name);
  check_cuda(cudaMemsetAsync(added.scratch, 0, sizeof(float), added.up.stream), "cudaMemsetAsync for " + name);
  return std::make_unique<NcclComm>(*this, added);
}

void World::abort(const std::string& reason) { fail(reason); }

std::shared_ptr<Event> World::issue(Group& group, bool down, const std::string& what, const NcclCall& call) {
  const std::lock_guard<std::timed_mutex> nccl(nccl_mutex_);
  throw_if_aborted();
  const Lane& lane = down ? group.down : group.up;
  // The operation reads what the compute stream has produced so far.
  check_cuda(cudaEventRecord(group.ready, group.compute_now()), "cudaEventRecord before " + what);
  check_cuda(cudaStreamWaitEvent(lane.stream, group.ready, 0), "cudaStreamWaitEvent before " + what);
  const ncclResult_t result = host_call(what, [&] { return call(lane.comm, lane.stream); });
  if (result != ncclSuccess) {
    fail_and_throw("rank " + std::to_string(rank_) + ": " + what + ": " + nccl_error_text(result, lane.comm));
  }
  auto done = std::make_shared<Event>();
  check_cuda(cudaEventCreateWithFlags(&done->event, cudaEventDisableTiming), "cudaEventCreate after " + what);
  check_cuda(cudaEventRecord(done->event, lane.stream), "cudaEventRecord after " + what);
  std::vector<std::shared_ptr<Event>> finished;  // destroyed on return, after the lock (see the top)
  const std::lock_guard<std::mutex> state(state_mutex_);
  finished.swap(finished_);
  in_flight_.push_back(InFlight{done, what, Clock::now()});
  return done;
}

void World::order_compute_after(const Group& group, const Event& done, const std::string& what) {
  throw_if_aborted();
  check_cuda(cudaStreamWaitEvent(group.compute_now(), done.event, 0), "cudaStreamWaitEvent for " + what);
}

void World::wait_on_host(const Event& done, const std::string& what) {
  // Returns when the barrier's reduction ends, or when the watchdog's abort ends it.
  const cudaError_t status = cudaEventSynchronize(done.event);
  throw_if_aborted();
  check_cuda(status, "cudaEventSynchronize in " + what);
}

std::string World::abort_reason() const {
  const std::lock_guard<std::mutex> state(state_mutex_);
  return reason_;
}

bool World::fail(const std::string& reason) {
  {
    const std::lock_guard<std::mutex> state(state_mutex_);
    if (aborted()) return false;
    reason_ = reason;
    aborted_.store(true, std::memory_order_release);
  }
  wake_.notify_all();
  return true;
}

void World::fail_and_throw(const std::string& reason) {
  fail(reason);
  throw_aborted();
}

void World::check_cuda(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) {
    fail_and_throw("rank " + std::to_string(rank_) + ": " + what + ": " + cudaGetErrorString(status));
  }
}

ncclResult_t World::host_call(const std::string& what, const std::function<ncclResult_t()>& call) {
  {
    const std::lock_guard<std::mutex> state(state_mutex_);
    host_call_.emplace(what, Clock::now());
  }
  const ncclResult_t result = call();
  const std::lock_guard<std::mutex> state(state_mutex_);
  host_call_.reset();
  return result;
}

void World::watch() {
  (void)cudaSetDevice(device_);  // events and communicators are queried on the world's GPU
  std::unique_lock<std::mutex> lock(state_mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, kPollInterval);
    if (stopping_) break;
    if (!aborted()) {
      const std::string failure = find_failure_locked();
      if (!failure.empty()) {
        reason_ = failure;
        aborted_.store(true, std::memory_order_release);
        exit_timer_.emplace(failure);
      }
    }
    if (aborted() && !communicators_aborted_) {
      lock.unlock();
      const bool done = abort_communicators();
      lock.lock();
      communicators_aborted_ = done;
    }
  }
}

std::string World::find_failure_locked() {
  const std::string prefix = "rank " + std::to_string(rank_) + ": ";
  const auto asynchronous_error = [](ncclComm_t comm) {
    ncclResult_t error = ncclSuccess;
    const ncclResult_t asked = ncclCommGetAsyncError(comm, &error);
    return asked != ncclSuccess ? asked : error;
  };
  for (const auto& group : groups_) {
    for (const ncclComm_t comm : {group->up.comm, group->down.comm}) {
      if (comm == nullptr) continue;
      const ncclResult_t error = asynchronous_error(comm);
      if (error != ncclSuccess && error != ncclInProgress) {
        return prefix + "NCCL failed on " + group->name() + ": " + nccl_error_text(error, comm);
      }
    }
  }
  if (world_comm_ != nullptr) {
    const ncclResult_t error = asynchronous_error(world_comm_);
    if (error != ncclSuccess && error != ncclInProgress) {
      return prefix + "NCCL failed on the world: " + nccl_error_text(error, world_comm_);
    }
  }
  const Clock::time_point now = Clock::now();
  if (host_call_ && now - host_call_->second > timeout_) {
    return prefix + "timed out after " + duration_text(timeout_) + " in " + host_call_->first;
  }
  while (!in_flight_.empty()) {  // oldest first: the one that hangs is named, not those behind it
    const InFlight& oldest = in_flight_.front();
    const cudaError_t status = cudaEventQuery(oldest.done->event);
    if (status == cudaErrorNotReady) break;
    if (status != cudaSuccess) return prefix + "CUDA failed in " + oldest.what + ": " + cudaGetErrorString(status);
    finished_.push_back(std::move(in_flight_.front().done));
    in_flight_.pop_front();
  }
  for (const InFlight& operation : in_flight_) {
    const cudaError_t status = cudaEventQuery(operation.done->event);
    if (status == cudaErrorNotReady && now - operation.issued > timeout_) {
      return prefix + "timed out after " + duration_text(timeout_) + " in " + operation.what;
    }
    if (status != cudaSuccess && status != cudaErrorNotReady) {
      return prefix + "CUDA failed in " + operation.what + ": " + cudaGetErrorString(status);
    }
  }
  return "";
}

bool World::abort_communicators() {
  // A caller blocked inside NCCL holds the mutex; then the process ends at the grace deadline.
  std::unique_lock<std::timed_mutex> nccl(nccl_mutex_, std::defer_lock);
  if (!nccl.try_lock_for(kExitGrace)) return false;
  const std::lock_guard<std::mutex> state(state_mutex_);
  for (auto group = groups_.rbegin(); group != groups_.rend(); ++group) {
    for (ncclComm_t* comm : {&(*group)->up.comm, &(*group)->down.comm}) {
      if (*comm) (void)ncclCommAbort(*comm);
      *comm = nullptr;
    }
  }
  if (world_comm_) (void)ncclCommAbort(world_comm_);
  world_comm_ = nullptr;
  return true;
}

bool World::all_complete() {
  const std::lock_guard<std::mutex> state(state_mutex_);
  return std::all_of(in_flight_.begin(), in_flight_.end(),
                     [](const InFlight& operation) { return cudaEventQuery(operation.done->event) == cudaSuccess; });
}

void World::stop_watchdog() {
  {
    const std::lock_guard<std::mutex> state(state_mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  // The process got here by itself: the timer's end is not needed.
  if (exit_timer_) exit_timer_->cancel();
}

void World::release(bool finalized) {
  // Nothing here waits for the GPU: a communicator that hangs is aborted, and the streams, events
  // and scratch go back to CUDA once their work is done.
  const auto close = [finalized](ncclComm_t& comm) {
    if (comm == nullptr) return;
    (void)(finalized ? ncclCommDestroy(comm) : ncclCommAbort(comm));
    comm = nullptr;
  };
  for (auto group = groups_.rbegin(); group != groups_.rend(); ++group) {
    Group& g = **group;
    close(g.up.comm);
    close(g.down.comm);
    if (g.scratch) (void)cudaFreeAsync(g.scratch, g.up.stream);
    for (const cudaStream_t stream : {g.up.stream, g.down.stream}) {
      if (stream) (void)cudaStreamDestroy(stream);
    }
    if (g.ready) (void)cudaEventDestroy(g.ready);
  }
  close(world_comm_);
  groups_.clear();
  in_flight_.clear();
  finished_.clear();
}

}  // namespace
}  // namespace megaplan::exec

namespace megaplan::cuda_module {

std::unique_ptr<exec::NcclWorld> make_nccl_world(int64_t rank, int64_t world_size, int device,
                                                 const exec::IdBroadcast& broadcast,
                                                 std::chrono::milliseconds timeout) {
  return std::make_unique<exec::World>(rank, world_size, device, broadcast, timeout);
}

}  // namespace megaplan::cuda_module
