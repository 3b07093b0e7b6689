// Send/receive insertion by simulating the ranks' progress in rounds.
#include "core/schedule/lowering.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/hot_loop.h"
#include "core/schedule/dependencies.h"

namespace megaplan {

namespace {

class Lowerer {
 public:
  explicit Lowerer(const PipelineSchedule& compute)
      : compute_(compute),
        shape_(compute.shape),
        index_(shape_),
        stage_ranks_(rank_of_each_stage(shape_)),
        out_(compute.ranks.size()),
        done_(index_.size()),
        next_(compute.ranks.size(), 0),
        waiting_(compute.ranks.size(), kNotWaiting),
        weight_gradients_(static_cast<std::size_t>(shape_.num_stages), 0) {
    // A rank's lowered list holds its compute, its sends, its receives and a few more.
    for (std::size_t rank = 0; rank < out_.size(); ++rank) out_[rank].reserve(3 * compute.ranks[rank].size() + 8);
  }

  PipelineSchedule run() {
    if (!run_rounds()) throw stuck();
    for (std::vector<Action>& actions : out_) order_receives_by_use(actions);
    PipelineSchedule lowered;
    lowered.shape = shape_;
    lowered.lowered = true;
    lowered.ranks = std::move(out_);
    for (auto& actions : lowered.ranks) actions.push_back(make_action(ActionKind::kOptimizer, 0, -1));
    return lowered;
  }

 private:
  // Rounds of one action per rank (when it can run), as torch's _add_send_recv does: the round a
  // send is placed in decides where its RECV lands on the receiver. False when no rank can move.
  // Flattened: it runs once per action of a million-action schedule, and the dependency rule, the
  // key index and the appends must inline into it; the error is built outside, by stuck().
  MEGAPLAN_HOT_LOOP bool run_rounds() {
    std::size_t remaining = 0;
    for (const auto& actions : compute_.ranks) remaining += actions.size();
    while (remaining > 0) {
      bool progress = false;
      for (std::size_t rank = 0; rank < compute_.ranks.size(); ++rank) {
        if (next_[rank] == compute_.ranks[rank].size()) continue;
        // A blocked rank stays blocked until the key it waits on is done: one look-up per round.
        if (waiting_[rank] != kNotWaiting && !done_.test(waiting_[rank])) continue;
        const Action& action = compute_.ranks[rank][next_[rank]];
        prefetch_ahead(rank);
        if (!ready(action, waiting_[rank])) continue;
        schedule(rank, action);
        ++next_[rank];
        --remaining;
        progress = true;
      }
      if (!progress) return false;
    }
    return true;
  }

  // Each round touches every rank's input and output once: 2 x pp slow streams that the hardware
  // prefetcher does not follow, so each would miss the cache every few actions. Fetching a few lines
  // ahead of both hides that latency (it halves lowering time at pp 64).
  void prefetch_ahead(std::size_t rank) const {
    constexpr std::size_t kAhead = 16;  // actions: about 5 cache lines
    const std::vector<Action>& input = compute_.ranks[rank];
    if (next_[rank] + kAhead < input.size()) __builtin_prefetch(input.data() + next_[rank] + kAhead);
    const std::vector<Action>& output = out_[rank];
    if (output.size() + kAhead < output.capacity()) __builtin_prefetch(output.data() + output.size() + kAhead, 1);
  }

  // Lowered dependencies all live on the action's own rank (a RECV stands in for the other
  // rank's work), so one "done" flag per key serves every rank.
  // Sets `waiting` to an outstanding key, or kNotWaiting when the action may run.
  bool ready(const Action& action, std::size_t& waiting) const {
    waiting = kNotWaiting;
    for_each_dependency(action, shape_, /*lowered=*/true, [&](const Action& needed) {
      const std::size_t key = index_(dependency_key(needed));
      if (!done_.test(key)) waiting = key;
    });
    return waiting == kNotWaiting;
  }

  // Appends an action the lowered schedule's computations wait on (a computation or a receive),
  // marking what it provides; sends and reductions are appended directly: nothing here waits on them.
  void append(std::size_t rank, const Action& action) {
    out_[rank].push_back(action);
    for_each_provided_key(action, [&](const DependencyKey& key) { done_.set(index_(key)); });
  }

  void schedule(std::size_t rank, const Action& action) {
    append(rank, action);
    if (action.kind != ActionKind::kOverlapForwardBackward) {
      add_messages_and_reductions(rank, action);
      return;
    }
    for (const Action& part : parts_of(action)) add_messages_and_reductions(rank, part);
  }

  // The sender places the receiver's RECV, so both sides of every link list messages in one order.
  void send(std::size_t rank, const Action& message) {
    out_[rank].push_back(message);
    const Action receive = matching_receive(message);
    append(static_cast<std::size_t>(stage_ranks_[static_cast<std::size_t>(receive.stage)]), receive);
  }

  void add_messages_and_reductions(std::size_t rank, const Action& action) {
    const int64_t s = action.stage;
    const int64_t m = action.microbatch;
    if (action.kind == ActionKind::kForward && s + 1 < shape_.num_stages && !shape_.next_stage_on_same_rank(s)) {
      send(rank, detail::derived_action(ActionKind::kSendForward, s, m));
    }
    const bool input_gradient = action.kind == ActionKind::kBackward || action.kind == ActionKind::kBackwardInput;
    if (input_gradient && s > 0 && !shape_.next_stage_on_same_rank(s - 1)) {
      send(rank, detail::derived_action(ActionKind::kSendBackward, s, m));
    }
    const bool weight_gradient = action.kind == ActionKind::kBackward || action.kind == ActionKind::kBackwardWeight;
    if (weight_gradient && ++weight_gradients_[static_cast<std::size_t>(s)] == shape_.microbatches) {
      out_[rank].push_back(detail::derived_action(ActionKind::kReduceGrad, s, -1));
    }
  }

  // The rounds place a rank's receives in the order its peers happened to send, which is not the
  // order it uses them where two peers feed it (a V's middle ranks in DualPipeV: a forward from
  // above and a gradient from below). A rank receives in list order, so a message needed later
  // would hold up one needed now. Receives keep their places in the list but are reassigned to them
  // earliest deadline first: a receive's deadline is the earliest use among itself and the later
  // messages of its peer (so each peer's messages keep the order it sends them in), and it may not
  // move before the rank's last send to that peer ahead of it (which the peer may need before it
  // sends this message). The original order meets every deadline and release, so this order does
  // too: every receive stays before its computation. validate_schedule passes on every generated
  // schedule of the tests' shapes (tests/core/schedule).
  // Within one peer both deadlines and releases grow along the list, so the most urgent released
  // receive is always some peer's first unplaced one: a merge of the peers' lists, no queue.
  // Flattened: it runs once per lowered action.
  MEGAPLAN_HOT_LOOP void order_receives_by_use(std::vector<Action>& actions) {
    // By receive, the computation using it (each has one, after it on the receiver's rank): one
    // table for every rank, each entry written once.
    if (used_at_.empty())
      used_at_.assign(2 * static_cast<std::size_t>(shape_.num_stages) * static_cast<std::size_t>(shape_.microbatches),
                      SIZE_MAX);
    const std::size_t ranks = static_cast<std::size_t>(shape_.pipeline_parallel_size);
    after_send_.assign(ranks, 0);
    last_of_peer_.assign(ranks, SIZE_MAX);
    receives_.clear();
    feeding_.clear();
    for (std::size_t i = 0; i < actions.size(); ++i) {
      const ActionKind kind = actions[i].kind;
      if (!is_message(kind)) {
        for_each_dependency(actions[i], shape_, /*lowered=*/true, [&](const Action& needed) {
          if (needed.kind == ActionKind::kRecvForward || needed.kind == ActionKind::kRecvBackward)
            used_at_[receive_slot(needed)] = i;
        });
        continue;
      }
      const std::size_t peer = peer_of(actions[i]);
      if (kind == ActionKind::kSendForward || kind == ActionKind::kSendBackward) {
        after_send_[peer] = i + 1;
        continue;
      }
      if (last_of_peer_[peer] == SIZE_MAX) {
        feeding_.push_back({receives_.size()});
      } else {
        receives_[last_of_peer_[peer]].next_of_peer = receives_.size();
      }
      last_of_peer_[peer] = receives_.size();
      receives_.push_back({i, after_send_[peer], receive_slot(actions[i]), 0, SIZE_MAX});
    }
    if (feeding_.size() < 2) return;  // one peer's receives keep their order
    // Deadlines: the earliest use among a receive and its peer's later ones.
    for (std::size_t k = receives_.size(); k-- > 0;) {
      Receive& receive = receives_[k];
      receive.deadline = used_at_[receive.slot];
      if (receive.next_of_peer != SIZE_MAX)
        receive.deadline = std::min(receive.deadline, receives_[receive.next_of_peer].deadline);
    }
    reordered_.resize(receives_.size());
    for (std::size_t k = 0; k < receives_.size(); ++k) {
      const Receive& slot = receives_[k];
      Feed* chosen = nullptr;
      for (Feed& feed : feeding_) {
        if (feed.head == SIZE_MAX || receives_[feed.head].release > slot.place) continue;
        const Receive& head = receives_[feed.head];
        if (!chosen || std::pair(head.deadline, head.place) <
                           std::pair(receives_[chosen->head].deadline, receives_[chosen->head].place))
          chosen = &feed;
      }
      reordered_[k] = actions[receives_[chosen->head].place];
      chosen->head = receives_[chosen->head].next_of_peer;
    }
    for (std::size_t k = 0; k < receives_.size(); ++k) actions[receives_[k].place] = reordered_[k];
  }

  std::size_t peer_of(const Action& message) const {
    return static_cast<std::size_t>(stage_ranks_[static_cast<std::size_t>(message_peer_stage(message))]);
  }
  // A receive's number among the shape's receives.
  std::size_t receive_slot(const Action& receive) const {
    return (static_cast<std::size_t>(receive.microbatch) * static_cast<std::size_t>(shape_.num_stages) +
            static_cast<std::size_t>(receive.stage)) *
               2 +
           (receive.kind == ActionKind::kRecvForward ? 0 : 1);
  }

  SpecError stuck() const {
    std::string waiting;
    for (std::size_t rank = 0; rank < compute_.ranks.size(); ++rank) {
      if (next_[rank] == compute_.ranks[rank].size()) continue;
      waiting += (waiting.empty() ? "" : ", ") + std::string("rank ") + std::to_string(rank) + " at " +
                 to_string(compute_.ranks[rank][next_[rank]]);
    }
    return SpecError("schedule", "cannot lower: no rank can run its next action (" + waiting +
                                     "): the compute order waits on work that is scheduled later");
  }

  const PipelineSchedule& compute_;
  const ScheduleShape shape_;
  const DependencyKeyIndex index_;
  const std::vector<int32_t> stage_ranks_;  // rank_of_each_stage(shape_)
  std::vector<std::vector<Action>> out_;
  KeyFlags done_;  // by DependencyKeyIndex
  std::vector<std::size_t> next_;
  static constexpr std::size_t kNotWaiting = SIZE_MAX;
  std::vector<std::size_t> waiting_;  // per rank: a key its next action waits for
  std::vector<int64_t> weight_gradients_;
  // order_receives_by_use's tables, allocated once.
  struct Receive {
    std::size_t place;         // in the rank's list
    std::size_t release;       // the earliest place it may take
    std::size_t slot;          // receive_slot
    std::size_t deadline;      // the earliest use among it and its peer's later receives
    std::size_t next_of_peer;  // the peer's next receive (index into receives_), or SIZE_MAX
  };
  struct Feed {
    std::size_t head;  // a peer's first receive not yet placed (index into receives_), or SIZE_MAX
  };
  std::vector<std::size_t> used_at_;                    // by receive_slot
  std::vector<std::size_t> after_send_, last_of_peer_;  // by peer rank
  std::vector<Receive> receives_;                       // the rank's, in list order
  std::vector<Feed> feeding_;                           // the peers the rank receives from
  std::vector<Action> reordered_;
};

}  // namespace

PipelineSchedule lower_schedule(const PipelineSchedule& compute) { return Lowerer(compute).run(); }

}  // namespace megaplan
