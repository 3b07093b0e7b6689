// The in-process communicators: group state shared by the member threads, the collectives
// computed by the last member to arrive, buffered point-to-point mailboxes, abort and timeout. The
// world's InProcessMemory moves and reduces the bytes (host memory, or one GPU) on each group's lane.
#include "executor/comm/in_process_comm.h"

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <stdexcept>

namespace megaplan::exec {
namespace in_process {

using Clock = std::chrono::steady_clock;

enum class CollectiveKind : uint8_t { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kBarrier };

const char* kind_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce: return "all_reduce";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kAllGather: return "all_gather";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kBarrier: return "barrier";
  }
  return "unknown collective";
}

// What one member passed to the collective it is blocked in. For all_reduce and broadcast, which
// work in place, input == output.
struct Contribution {
  bool present = false;
  CollectiveKind kind = CollectiveKind::kBarrier;
  const void* input = nullptr;
  void* output = nullptr;
  std::size_t count = 0;
  DType type = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int64_t root = 0;
  StreamPoint ready;  // the member's compute stream at its call: its input is produced, its output free
};

// Gives a message's staging back to the lane it came from, in the lane's order.
struct StagingRelease {
  Lane* lane = nullptr;
  void operator()(void* staging) const noexcept { lane->release_staging(staging); }
};

// A buffered send, waiting for the recv with its sequence number.
struct Message {
  std::unique_ptr<void, StagingRelease> staging;  // the sent bytes; null when there are none
  std::size_t count = 0;
  DType type = DType::kFloat32;
  StreamPoint sent;  // the lane after the copy into staging
};

struct GroupState {
  GroupState(std::string label_in, std::vector<int64_t> ranks_in, std::unique_ptr<Lane> lane_in)
      : label(std::move(label_in)),
        ranks(std::move(ranks_in)),
        lane(std::move(lane_in)),
        member_live(ranks.size(), false),
        contributions(ranks.size()),
        sends_made(ranks.size() * ranks.size(), 0),
        recvs_posted(ranks.size() * ranks.size(), 0),
        mailboxes(ranks.size() * ranks.size()) {}

  int64_t size() const { return static_cast<int64_t>(ranks.size()); }
  std::size_t pair_index(int64_t sender, int64_t receiver) const {
    return static_cast<std::size_t>(sender * size() + receiver);
  }

  const std::string label;
  const std::vector<int64_t> ranks;
  // The group's byte movement; declared before the mailboxes, whose unread staging goes back to it.
  const std::unique_ptr<Lane> lane;

  std::mutex mutex;                 // guards everything below
  std::condition_variable changed;  // a collective completed, a message arrived, the world aborted
  std::vector<bool> member_live;    // by group rank: a communicator exists

  // The collective in progress: contributions by group rank, how many are present, and how many
  // collectives have completed (a blocked member waits for it to move past the value it saw).
  std::vector<Contribution> contributions;
  int64_t arrived = 0;
  uint64_t generation = 0;
  // The lane after the latest completed collective's results; read by its released members (the
  // next collective cannot complete before every one of them has joined it).
  StreamPoint completed;

  // Point to point, indexed by pair_index(sender, receiver): the k-th send of a pair is message k
  // of its mailbox, and the k-th recv posted for the pair takes it.
  std::vector<uint64_t> sends_made;
  std::vector<uint64_t> recvs_posted;
  std::vector<std::map<uint64_t, Message>> mailboxes;
};

namespace {

std::string group_name(const GroupState& state) { return "group " + state.label + " " + rank_list(state.ranks); }

void throw_if_aborted(const InProcessWorld& world) {
  if (world.aborted()) throw CommAborted(world.abort_reason());
}

// Blocks on state.changed until done() holds, or throws CommAborted when the world is aborted first
// or the world's timeout passes first (then this member aborts the world, naming what it waited for:
// describe() is called under the lock). `lock` holds state.mutex; it is released when this throws.
template <typename Done, typename Describe>
void wait_for(InProcessWorld& world, GroupState& state, std::unique_lock<std::mutex>& lock, int64_t global_rank,
              const Done& done, const Describe& describe) {
  const auto deadline = Clock::now() + world.timeout();
  while (!done()) {
    throw_if_aborted(world);
    if (state.changed.wait_until(lock, deadline) == std::cv_status::timeout && !done()) {
      throw_if_aborted(world);
      const std::string reason = "rank " + std::to_string(global_rank) + ": timed out after " +
                                 duration_text(world.timeout()) + " in " + describe();
      // abort() locks every group's mutex to wake its members, this one's included.
      lock.unlock();
      world.abort(reason);
      throw CommAborted(world.abort_reason());
    }
  }
}

std::string call_text(const Contribution& call) {
  std::string text = std::string(kind_name(call.kind)) + "(" + std::to_string(call.count) + " " + to_string(call.type);
  if (call.kind == CollectiveKind::kAllReduce || call.kind == CollectiveKind::kReduceScatter) {
    text += call.op == ReduceOp::kSum ? ", sum" : ", max";
  }
  if (call.kind == CollectiveKind::kBroadcast) text += ", root " + std::to_string(call.root);
  return text + ")";
}

bool same_call(const Contribution& a, const Contribution& b) {
  if (a.kind != b.kind) return false;
  if (a.kind == CollectiveKind::kBarrier) return true;
  if (a.count != b.count || a.type != b.type) return false;
  if ((a.kind == CollectiveKind::kAllReduce || a.kind == CollectiveKind::kReduceScatter) && a.op != b.op) {
    return false;
  }
  return a.kind != CollectiveKind::kBroadcast || a.root == b.root;
}

// Writes every member's result on the group's lane. REQUIRES: every member's contribution is present
// and the same call, and the lane waits for every member's ready point.
void compute_collective(GroupState& state) {
  Lane& lane = *state.lane;
  const Contribution& first = state.contributions[0];
  const std::size_t count = first.count;
  const std::size_t bytes = count * dtype_bytes(first.type);
  if (bytes == 0) return;  // a barrier, or an empty buffer
  // Byte `offset` of a member's input, for the reductions.
  const auto inputs_at = [&](std::size_t offset) {
    std::vector<const void*> inputs;
    for (const Contribution& member : state.contributions) {
      inputs.push_back(static_cast<const std::byte*>(member.input) + offset);
    }
    return inputs;
  };
  switch (first.kind) {
    case CollectiveKind::kAllReduce:
      // Into group rank 0's buffer (its own input: reductions are element-wise), then copied to the
      // others, whose inputs have been read by then.
      lane.reduce(first.output, inputs_at(0), count, first.type, first.op);
      for (std::size_t member = 1; member < state.contributions.size(); ++member) {
        lane.copy(state.contributions[member].output, first.output, bytes);
      }
      break;
    case CollectiveKind::kReduceScatter:
      // Target by target: with NCCL's in-place layout a member's output is its own chunk of its
      // input (reduced in place), which no later target reads.
      for (std::size_t target = 0; target < state.contributions.size(); ++target) {
        lane.reduce(state.contributions[target].output, inputs_at(target * bytes), count, first.type, first.op);
      }
      break;
    case CollectiveKind::kAllGather:
      for (const Contribution& target : state.contributions) {
        for (std::size_t source = 0; source < state.contributions.size(); ++source) {
          // In place, a member's own input already sits at its chunk of its output.
          void* chunk = static_cast<std::byte*>(target.output) + source * bytes;
          if (chunk != state.contributions[source].input) lane.copy(chunk, state.contributions[source].input, bytes);
        }
      }
      break;
    case CollectiveKind::kBroadcast: {
      const void* root_data = state.contributions[static_cast<std::size_t>(first.root)].input;
      for (const Contribution& member : state.contributions) {
        if (member.output != root_data) lane.copy(member.output, root_data, bytes);
      }
      break;
    }
    case CollectiveKind::kBarrier: break;
  }
}

// An operation whose work has been given to a lane: wait() makes the member's stream start its later
// work after `done`.
class IssuedRequest final : public CommRequest {
 public:
  IssuedRequest(const InProcessWorld& world, ComputeStream stream, StreamPoint done)
      : world_(world), stream_(std::move(stream)), done_(std::move(done)) {}
  void wait() override {
    throw_if_aborted(world_);
    world_.memory().wait(current_stream(stream_), done_);
  }

 private:
  const InProcessWorld& world_;
  ComputeStream stream_;
  StreamPoint done_;
};

class RecvRequest final : public CommRequest {
 public:
  RecvRequest(InProcessWorld& world, GroupState& state, int64_t rank, int64_t peer, uint64_t sequence, void* data,
              std::size_t count, DType type, ComputeStream stream)
      : world_(world),
        state_(state),
        rank_(rank),
        peer_(peer),
        sequence_(sequence),
        data_(data),
        count_(count),
        type_(type),
        stream_(std::move(stream)) {}

  void wait() override {
    throw_if_aborted(world_);
    if (done_) return;
    Message message;
    {
      std::unique_lock<std::mutex> lock(state_.mutex);
      auto& mailbox = state_.mailboxes[state_.pair_index(peer_, rank_)];
      const int64_t global_rank = state_.ranks[static_cast<std::size_t>(rank_)];
      wait_for(
          world_, state_, lock, global_rank, [&] { return mailbox.count(sequence_) != 0; },
          [&] {
            return "recv from rank " + std::to_string(state_.ranks[static_cast<std::size_t>(peer_)]) + " on " +
                   group_name(state_);
          });
      auto found = mailbox.find(sequence_);
      message = std::move(found->second);
      mailbox.erase(found);
    }
    done_ = true;
    if (message.count != count_ || message.type != type_) {
      throw std::logic_error("rank " + std::to_string(state_.ranks[static_cast<std::size_t>(rank_)]) + ": recv of " +
                             std::to_string(count_) + " " + to_string(type_) + " from rank " +
                             std::to_string(state_.ranks[static_cast<std::size_t>(peer_)]) + " on " +
                             group_name(state_) + " matched a send of " + std::to_string(message.count) + " " +
                             to_string(message.type));
    }
    if (!message.staging) return;
    // After the send's copy in, and after what this member has given its stream so far (which may
    // still read the buffer); the member's later work after the copy out.
    Lane& lane = *state_.lane;
    lane.wait(message.sent);
    void* const stream = current_stream(stream_);
    lane.wait(world_.memory().record(stream));
    lane.copy(data_, message.staging.get(), count_ * dtype_bytes(type_));
    world_.memory().wait(stream, lane.record());
  }  // the staging goes back to the lane here, after the copy out

 private:
  InProcessWorld& world_;
  GroupState& state_;
  int64_t rank_, peer_;
  uint64_t sequence_;
  void* data_;
  std::size_t count_;
  DType type_;
  ComputeStream stream_;
  bool done_ = false;
};

class InProcessComm final : public Comm {
 public:
  InProcessComm(InProcessWorld& world, GroupState& state, int64_t rank, ComputeStream stream)
      : world_(world), state_(state), rank_(rank), stream_(std::move(stream)) {}
  ~InProcessComm() override {
    const std::lock_guard<std::mutex> lock(state_.mutex);
    state_.member_live[static_cast<std::size_t>(rank_)] = false;
  }

  std::string name() const override { return "in-process-" + world_.memory().name(); }
  int64_t rank() const override { return rank_; }
  int64_t size() const override { return state_.size(); }
  const std::vector<int64_t>& global_ranks() const override { return state_.ranks; }

  Request send(const void* data, std::size_t count, DType type, int64_t peer) override {
    check_peer(peer, "send");
    check_buffer(data, count, "send");
    return post_send(data, count, type, peer);
  }

  Request recv(void* data, std::size_t count, DType type, int64_t peer) override {
    check_peer(peer, "recv");
    check_buffer(data, count, "recv");
    return post_recv(data, count, type, peer);
  }

  // In process a send never waits for its receive, so the two apart are the one operation.
  Request send_recv(const void* send_data, int64_t to, void* recv_data, int64_t from, std::size_t count,
                    DType type) override {
    return both(send(send_data, count, type, to), recv(recv_data, count, type, from));
  }

  // Every segment a message of its pair (the member's own through its own mailbox): the sends
  // first, which never wait, then the receives.
  Request all_to_all(const void* input, const std::vector<std::size_t>& send_counts, void* output,
                     const std::vector<std::size_t>& recv_counts, DType type) override {
    check_segment_counts(send_counts, size(), group_name(state_), "send_counts");
    check_segment_counts(recv_counts, size(), group_name(state_), "recv_counts");
    const std::size_t element = dtype_bytes(type);
    std::vector<Request> requests;
    std::size_t offset = 0;
    for (int64_t peer = 0; peer < size(); ++peer) {
      const std::size_t count = send_counts[static_cast<std::size_t>(peer)];
      check_buffer(input, count, "all_to_all");
      requests.push_back(post_send(static_cast<const char*>(input) + offset * element, count, type, peer));
      offset += count;
    }
    offset = 0;
    for (int64_t peer = 0; peer < size(); ++peer) {
      const std::size_t count = recv_counts[static_cast<std::size_t>(peer)];
      check_buffer(output, count, "all_to_all");
      requests.push_back(post_recv(static_cast<char*>(output) + offset * element, count, type, peer));
      offset += count;
    }
    return all_of(std::move(requests));
  }

  Request all_reduce(void* data, std::size_t count, DType type, ReduceOp op) override {
    check_buffer(data, count, "all_reduce");
    return collective({true, CollectiveKind::kAllReduce, data, data, count, type, op, 0, nullptr});
  }

  Request reduce_scatter(const void* input, void* output, std::size_t count, DType type, ReduceOp op) override {
    check_buffer(input, count, "reduce_scatter");
    check_buffer(output, count, "reduce_scatter");
    return collective({true, CollectiveKind::kReduceScatter, input, output, count, type, op, 0, nullptr});
  }

  Request all_gather(const void* input, void* output, std::size_t count, DType type) override {
    check_buffer(input, count, "all_gather");
    check_buffer(output, count, "all_gather");
    return collective({true, CollectiveKind::kAllGather, input, output, count, type, ReduceOp::kSum, 0, nullptr});
  }

  Request broadcast(void* data, std::size_t count, DType type, int64_t root) override {
    if (root < 0 || root >= size()) {
      throw std::invalid_argument("broadcast on " + group_name(state_) + ": root " + std::to_string(root) +
                                  " is not a group rank (0.." + std::to_string(size() - 1) + ")");
    }
    check_buffer(data, count, "broadcast");
    return collective({true, CollectiveKind::kBroadcast, data, data, count, type, ReduceOp::kSum, root, nullptr});
  }

  void barrier() override {
    collective({true, CollectiveKind::kBarrier, nullptr, nullptr, 0, DType::kFloat32, ReduceOp::kSum, 0, nullptr});
  }

 private:
  int64_t global_rank() const { return state_.ranks[static_cast<std::size_t>(rank_)]; }

  // A send into the pair's mailbox, staged on the group's lane; `peer` may be this member.
  Request post_send(const void* data, std::size_t count, DType type, int64_t peer) {
    Lane& lane = *state_.lane;
    Message message;
    message.count = count;
    message.type = type;
    if (const std::size_t bytes = count * dtype_bytes(type); bytes > 0) {
      message.staging = std::unique_ptr<void, StagingRelease>(lane.allocate_staging(bytes), StagingRelease{&lane});
      lane.wait(world_.memory().record(current_stream(stream_)));  // the data is produced
      lane.copy(message.staging.get(), data, bytes);
      message.sent = lane.record();
    }
    StreamPoint sent = message.sent;
    {
      const std::lock_guard<std::mutex> lock(state_.mutex);
      throw_if_aborted(world_);
      const std::size_t pair = state_.pair_index(rank_, peer);
      state_.mailboxes[pair].emplace(state_.sends_made[pair]++, std::move(message));
    }
    state_.changed.notify_all();
    // The sender may change its buffer once the copy into staging is done.
    return std::make_unique<IssuedRequest>(world_, stream_, std::move(sent));
  }

  // The pair's next receive; `peer` may be this member.
  Request post_recv(void* data, std::size_t count, DType type, int64_t peer) {
    const std::lock_guard<std::mutex> lock(state_.mutex);
    throw_if_aborted(world_);
    const uint64_t sequence = state_.recvs_posted[state_.pair_index(peer, rank_)]++;
    return std::make_unique<RecvRequest>(world_, state_, rank_, peer, sequence, data, count, type, stream_);
  }

  void check_peer(int64_t peer, const char* operation) const {
    if (peer < 0 || peer >= size() || peer == rank_) {
      throw std::invalid_argument(std::string(operation) + " on " + group_name(state_) + ": peer " +
                                  std::to_string(peer) + " is not another group rank of group rank " +
                                  std::to_string(rank_));
    }
  }

  void check_buffer(const void* data, std::size_t count, const char* operation) const {
    if (data == nullptr && count > 0) {
      throw std::invalid_argument(std::string(operation) + " on " + group_name(state_) + ": null buffer for " +
                                  std::to_string(count) + " elements");
    }
  }

  // Deposits this member's call and blocks until the last member has computed every result.
  Request collective(Contribution call) {
    call.ready = world_.memory().record(current_stream(stream_));
    std::unique_lock<std::mutex> lock(state_.mutex);
    throw_if_aborted(world_);
    state_.contributions[static_cast<std::size_t>(rank_)] = call;
    if (++state_.arrived < size()) {
      const uint64_t generation = state_.generation;
      wait_for(
          world_, state_, lock, global_rank(), [&] { return state_.generation != generation; },
          [&] { return std::string(kind_name(call.kind)) + " on " + group_name(state_) + missing_members(); });
      return std::make_unique<IssuedRequest>(world_, stream_, state_.completed);
    }
    // Every member is blocked here with its buffers alive: one that left early did so because the
    // world was aborted, and then throw_if_aborted above has thrown.
    const Contribution& first = state_.contributions[0];
    for (const Contribution& other : state_.contributions) {
      if (same_call(first, other)) continue;
      std::string message =
          "rank " + std::to_string(global_rank()) + ": collective mismatch on " + group_name(state_) + ":";
      for (std::size_t member = 0; member < state_.contributions.size(); ++member) {
        message += (member ? ", " : " ") + std::string("group rank ") + std::to_string(member) + " called " +
                   call_text(state_.contributions[member]);
      }
      lock.unlock();
      world_.abort(message);
      throw std::logic_error(message);
    }
    try {
      for (const Contribution& member : state_.contributions) state_.lane->wait(member.ready);
      compute_collective(state_);
      state_.completed = state_.lane->record();
    } catch (const std::exception& error) {  // e.g. a CUDA error: the blocked members must not wait for the timeout
      lock.unlock();
      world_.abort("rank " + std::to_string(global_rank()) + ": " + error.what());
      throw;
    }
    for (Contribution& member : state_.contributions) member.present = false;
    state_.arrived = 0;
    ++state_.generation;
    StreamPoint completed = state_.completed;
    lock.unlock();
    state_.changed.notify_all();
    return std::make_unique<IssuedRequest>(world_, stream_, std::move(completed));
  }

  // "; waiting for ranks [..]": the global ranks that have not joined the collective in progress.
  std::string missing_members() const {
    std::vector<int64_t> missing;
    for (std::size_t member = 0; member < state_.contributions.size(); ++member) {
      if (!state_.contributions[member].present) missing.push_back(state_.ranks[member]);
    }
    return "; waiting for ranks " + rank_list(missing);
  }

  InProcessWorld& world_;
  GroupState& state_;
  int64_t rank_;
  ComputeStream stream_;  // the member's compute stream
};

}  // namespace
}  // namespace in_process

InProcessWorld::InProcessWorld(int64_t world_size, std::chrono::milliseconds timeout,
                               std::unique_ptr<InProcessMemory> memory)
    : world_size_(world_size), timeout_(timeout), memory_(std::move(memory)) {
  if (world_size <= 0)
    throw std::invalid_argument("InProcessWorld: world size " + std::to_string(world_size) + " <= 0");
  if (timeout.count() <= 0) throw std::invalid_argument("InProcessWorld: timeout must be positive");
  if (!memory_) throw std::invalid_argument("InProcessWorld: no memory");
}

InProcessWorld::~InProcessWorld() = default;

std::unique_ptr<Comm> InProcessWorld::group(int64_t global_rank, const std::vector<int64_t>& ranks, std::string label,
                                            ComputeStream compute_stream) {
  const std::string described = "group " + label + " " + rank_list(ranks);
  if (ranks.empty()) throw std::invalid_argument("InProcessWorld::group: " + described + " has no ranks");
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= world_size_) {
      throw std::invalid_argument("InProcessWorld::group: " + described + " names rank " + std::to_string(ranks[i]) +
                                  " outside the world of " + std::to_string(world_size_));
    }
    if (std::find(ranks.begin(), ranks.begin() + static_cast<std::ptrdiff_t>(i), ranks[i]) !=
        ranks.begin() + static_cast<std::ptrdiff_t>(i)) {
      throw std::invalid_argument("InProcessWorld::group: " + described + " names rank " + std::to_string(ranks[i]) +
                                  " twice");
    }
  }
  const auto position = std::find(ranks.begin(), ranks.end(), global_rank);
  if (position == ranks.end()) {
    throw std::invalid_argument("InProcessWorld::group: rank " + std::to_string(global_rank) + " is not a member of " +
                                described);
  }
  const int64_t group_rank = position - ranks.begin();

  in_process::GroupState* state;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    auto& slot = groups_[GroupKey(label, ranks)];
    if (!slot) slot = std::make_unique<in_process::GroupState>(label, ranks, memory_->make_lane());
    state = slot.get();
  }
  {
    const std::lock_guard<std::mutex> lock(state->mutex);
    const auto member = static_cast<std::size_t>(group_rank);
    if (state->member_live[member]) {
      throw std::logic_error("InProcessWorld::group: rank " + std::to_string(global_rank) +
                             " already holds a communicator for " + described);
    }
    state->member_live[member] = true;
  }
  return std::make_unique<in_process::InProcessComm>(*this, *state, group_rank, std::move(compute_stream));
}

void InProcessWorld::abort(const std::string& reason) {
  std::vector<in_process::GroupState*> states;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_.load(std::memory_order_relaxed)) return;
    abort_reason_ = reason;
    aborted_.store(true, std::memory_order_release);
    for (auto& [key, state] : groups_) states.push_back(state.get());
  }
  // Taking each group's mutex before notifying means a member that saw the world not aborted is
  // already waiting on the condition variable, so it cannot miss this wake-up.
  for (in_process::GroupState* state : states) {
    { const std::lock_guard<std::mutex> lock(state->mutex); }
    state->changed.notify_all();
  }
}

std::string InProcessWorld::abort_reason() const {
  if (!aborted()) return {};
  return abort_reason_;  // immutable once aborted_ is set
}

}  // namespace megaplan::exec
