// Send/receive insertion by simulating the ranks' progress in rounds.
#include "core/schedule/lowering.h"

#include "core/error.h"
#include "core/schedule/dependencies.h"

namespace megaplan {

namespace {

class Lowerer {
 public:
  explicit Lowerer(const PipelineSchedule& compute)
      : compute_(compute), shape_(compute.shape), index_(shape_), stage_ranks_(rank_of_each_stage(shape_)),
        out_(compute.ranks.size()), done_(index_.size()),
        next_(compute.ranks.size(), 0), waiting_(compute.ranks.size(), kNotWaiting), weight_gradients_(static_cast<std::size_t>(shape_.num_stages), 0) {
    // A rank's lowered list holds its compute, its sends, its receives and a few more.
    for (std::size_t rank = 0; rank < out_.size(); ++rank) out_[rank].reserve(3 * compute.ranks[rank].size() + 8);
  }

  PipelineSchedule run() {
    if (!run_rounds()) throw stuck();
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
  [[gnu::flatten]] bool run_rounds() {
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
};

}  // namespace

PipelineSchedule lower_schedule(const PipelineSchedule& compute) { return Lowerer(compute).run(); }

}  // namespace megaplan
