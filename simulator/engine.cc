// The engine as a longest-path sweep: an action's start is max(its stream free, its dependencies
// done), which does not depend on the order actions are looked at, so ranks are advanced as far as
// what is already known allows, and a rank is looked at again when a transfer another rank began
// makes more known. No event queue: only the gradient reduction's overlap depends on order, and it
// is defined in time terms (engine.h), which the compute stream's loop applies as it goes.
#include "simulator/engine.h"

#include <algorithm>
#include <array>
#include <limits>
#include <optional>

#include "core/error.h"
#include "core/hot_loop.h"
#include "core/schedule/dependencies.h"
#include "simulator/dependency_slots.h"
#include "simulator/transfer_rendezvous.h"

namespace megaplan::sim {

namespace {

constexpr double kUnknown = kUnknownTime;
constexpr double kNever = std::numeric_limits<double>::infinity();
constexpr std::size_t kStreams = kTimelineStreamCount;
constexpr std::size_t kCompute = static_cast<std::size_t>(TimelineStream::kCompute);
constexpr std::size_t kSend = static_cast<std::size_t>(TimelineStream::kSend);
constexpr std::size_t kReceive = static_cast<std::size_t>(TimelineStream::kReceive);
constexpr std::size_t kDataParallel = static_cast<std::size_t>(TimelineStream::kDataParallel);

// Core's stream_of as the index of the engine's per-stream arrays.
constexpr std::size_t stream_index(ActionKind kind) { return static_cast<std::size_t>(stream_of(kind)); }

// A stage's weight gradients as they are computed, or a rank's (all its stages') without overlap.
struct WeightGradients {
  int64_t done = 0;
  double last_start = 0;  // the run of the latest, which fills the buckets
  double last_end = 0;
  void note(double start, double end) {
    ++done;
    if (end >= last_end) {
      last_end = end;
      last_start = start;
    }
  }
};

struct RankState {
  // Per stream: its next action's index in the rank's list (the list's size at its end). The
  // streams walk the one list side by side, so their heads share cache lines; the data-parallel
  // stream's few reductions, near the list's end, are listed instead.
  std::array<std::size_t, kStreams> head{};
  std::vector<uint32_t> reductions;           // the data-parallel stream's actions, in order
  std::size_t reductions_done = 0;            // of them
  std::array<int64_t, kStreams> completed{};  // actions per stream
  std::array<double, kStreams> free{};
  std::array<std::size_t, kStreams> waiting_on{DependencySlots::kNone, DependencySlots::kNone, DependencySlots::kNone,
                                               DependencySlots::kNone};
  // Per stream: its head transfer was reached and waits for the other side, which begins it for both.
  std::array<bool, kStreams> reached_head{};
  double reduction_issued = 0;   // when the data-parallel stream's last reduction was issued
  WeightGradients gradients;     // all the rank's stages', for reductions that wait for the whole backward
  int64_t weight_gradients = 0;  // how many the rank computes: microbatches x its stages
  double compute_busy_in_pipeline = 0;
  double end = 0;
  bool queued = false;  // on the engine's work list
  RankSimulation result;
};

// When and how each action ran, kept for the timeline.
struct ActionRun {
  double start = 0;
  double end = 0;
  double collectives = 0;
};

class Engine {
 public:
  Engine(const PipelineSchedule& schedule, const ActionCosts& costs, bool record)
      : schedule_(schedule),
        shape_(schedule.shape),
        costs_(costs),
        record_(record),
        index_(shape_),
        stage_ranks_(rank_of_each_stage(shape_)),
        keys_(index_.size()),
        stage_gradients_(static_cast<std::size_t>(shape_.num_stages)),
        ranks_(schedule.ranks.size()) {
    std::vector<std::size_t> stages_on_rank(ranks_.size(), 0);
    for (const int32_t rank : stage_ranks_) {
      ranks_[static_cast<std::size_t>(rank)].weight_gradients += shape_.microbatches;
      ++stages_on_rank[static_cast<std::size_t>(rank)];
    }
    for (std::size_t rank = 0; rank < ranks_.size(); ++rank) {
      const auto& actions = schedule.ranks[rank];
      RankState& state = ranks_[rank];
      state.head.fill(actions.size());
      // The other streams' first actions lie at the list's start; the reductions, one a stage (a
      // validated schedule repeats none), after its backward near the list's end: each list is
      // read from both ends only as far as these lie.
      std::size_t found = 0;
      for (std::size_t i = 0; i < actions.size() && found < kStreams - 1; ++i) {
        const std::size_t stream = stream_index(actions[i].kind);
        if (stream != kDataParallel && state.head[stream] == actions.size()) {
          state.head[stream] = i;
          ++found;
        }
      }
      for (std::size_t i = actions.size(); i-- > 0 && state.reductions.size() < stages_on_rank[rank];) {
        if (stream_index(actions[i].kind) == kDataParallel) state.reductions.push_back(static_cast<uint32_t>(i));
      }
      std::reverse(state.reductions.begin(), state.reductions.end());
      if (!state.reductions.empty()) state.head[kDataParallel] = state.reductions.front();
      if (record_) runs_.emplace_back(actions.size());
    }
  }

  // Flattened: the loop runs once per action, and the dependency rule, the key index and the
  // stream logic must inline into it.
  MEGAPLAN_HOT_LOOP SimulationResult run() {
    for (std::size_t rank = ranks_.size(); rank-- > 0;) look_again(rank);
    while (!work_.empty()) {
      const std::size_t rank = work_.back();
      work_.pop_back();
      ranks_[rank].queued = false;
      advance_rank(rank);
    }
    finish();
    return std::move(result_);
  }

 private:
  void look_again(std::size_t rank) {
    if (ranks_[rank].queued) return;
    ranks_[rank].queued = true;
    work_.push_back(rank);
  }

  // Each stream as far as what is known allows, in the order they feed each other: a transfer
  // begun feeds the compute stream, which feeds the send stream (a rank's receives wait on other
  // ranks only); OPTIM, last on the compute stream, waits for the send stream's end.
  void advance_rank(std::size_t rank) {
    advance_messages(rank, kReceive);
    advance_compute(rank);
    if (advance_messages(rank, kSend) && !at_end(rank, kCompute)) advance_compute(rank);
  }

  const Action& head_action(std::size_t rank, std::size_t stream) const {
    return schedule_.ranks[rank][ranks_[rank].head[stream]];
  }

  bool at_end(std::size_t rank, std::size_t stream) const {
    return ranks_[rank].head[stream] == schedule_.ranks[rank].size();
  }

  // False while the stream still waits for the dependency it last found missing.
  bool still_waiting(RankState& state, std::size_t stream) {
    std::size_t& waiting_on = state.waiting_on[stream];
    if (waiting_on == DependencySlots::kNone) return false;
    if (keys_[waiting_on].done == kUnknown) return true;
    waiting_on = DependencySlots::kNone;
    return false;
  }

  // Latest completion among the action's dependencies, or kUnknown while one is not known yet
  // (remembered as what the stream waits on, so that looking again costs one look-up).
  double dependencies_done(const Action& action, std::size_t rank, std::size_t stream) {
    double ready = 0;
    std::size_t missing = DependencySlots::kNone;
    receives_waited_on_ = 0;
    for_each_dependency(action, shape_, /*lowered=*/true, [&](const Action& needed) {
      const std::size_t key = index_(dependency_key(needed));
      const double done = keys_[key].done;
      if (done == kUnknown) missing = key;
      ready = std::max(ready, done);
      const bool receive = needed.kind == ActionKind::kRecvForward || needed.kind == ActionKind::kRecvBackward;
      if (receive && receives_waited_on_ < receive_keys_.size()) receive_keys_[receives_waited_on_++] = key;
    });
    if (missing == DependencySlots::kNone) return ready;
    ranks_[rank].waiting_on[stream] = missing;
    return kUnknown;
  }

  // The compute stream, with the data-parallel stream's reductions issued between its actions
  // where their issue times fall.
  bool advance_compute(std::size_t rank) {
    RankState& state = ranks_[rank];
    if (still_waiting(state, kCompute)) return false;
    bool moved = false;
    while (!at_end(rank, kCompute)) {
      const Action& action = head_action(rank, kCompute);
      if (action.kind == ActionKind::kOptimizer) {
        issue_reductions(rank, kNever);
        if (!start_optimizer(rank)) return moved;
      } else {
        const double ready = dependencies_done(action, rank, kCompute);
        if (ready == kUnknown) return moved;
        issue_reductions(rank, ready);
        start_compute(rank, action, ready);
      }
      moved = true;
    }
    return moved;
  }

  // The send or receive stream: each side reaches its transfer in turn; the side that finds the
  // other there begins it for both.
  bool advance_messages(std::size_t rank, std::size_t stream) {
    RankState& state = ranks_[rank];
    if (state.reached_head[stream] || still_waiting(state, stream)) return false;
    bool moved = false;
    while (!at_end(rank, stream)) {
      if (!reach_message(rank, stream, head_action(rank, stream))) return moved;
      moved = true;
    }
    return moved;
  }

  // The head of `stream` on `rank` ran from start to end (what it provides, its caller records).
  void complete(std::size_t rank, std::size_t stream, double start, double end, double collectives = 0) {
    RankState& state = ranks_[rank];
    const std::size_t step = state.head[stream];
    state.free[stream] = end;
    state.reached_head[stream] = false;
    ++state.completed[stream];
    state.head[stream] = next_of_stream(rank, stream, step);
    state.end = std::max(state.end, end);
    if (record_) runs_[rank][step] = {start, end, collectives};
  }

  // The stream's next action after `step`. The engine moves between pp lists, more than the
  // hardware prefetcher follows: fetching a few actions ahead hides the cache misses on them.
  std::size_t next_of_stream(std::size_t rank, std::size_t stream, std::size_t step) {
    const std::vector<Action>& actions = schedule_.ranks[rank];
    if (stream == kDataParallel) {
      RankState& state = ranks_[rank];
      return ++state.reductions_done < state.reductions.size() ? state.reductions[state.reductions_done]
                                                               : actions.size();
    }
    constexpr std::size_t kAhead = 16;
    if (step + kAhead < actions.size()) __builtin_prefetch(actions.data() + step + kAhead);
    std::size_t next = step + 1;
    while (next < actions.size() && stream_index(actions[next].kind) != stream) ++next;
    return next;
  }

  double compute_seconds(const Action& part, double& collectives) const {
    const StageCosts& stage = costs_.stages[static_cast<std::size_t>(part.stage)];
    switch (part.kind) {
      case ActionKind::kForward: collectives += stage.forward_collectives; return stage.forward;
      case ActionKind::kBackward: collectives += stage.backward_collectives; return stage.backward;
      case ActionKind::kBackwardInput: collectives += stage.backward_collectives; return stage.backward_input;
      default:  // kBackwardWeight
        collectives += stage.weight_collectives;
        return stage.backward_weight;
    }
  }

  void start_compute(std::size_t rank, const Action& action, double ready) {
    RankState& state = ranks_[rank];
    const double free = state.free[kCompute];
    const double start = std::max(free, ready);
    double collectives = 0;
    double duration = 0;
    for (const Action& part : parts_of(action)) duration += compute_seconds(part, collectives);
    account_gap(state, free, start);
    state.result.compute_s += duration - collectives;
    state.result.collective_s += collectives;
    state.compute_busy_in_pipeline += duration;
    const double end = start + duration;
    for_each_provided_key(action, [&](const DependencyKey& key) {  // F, I, W
      keys_[index_(key)] = {start, end};
      if (key.kind == ActionKind::kBackwardWeight) {
        stage_gradients_[static_cast<std::size_t>(key.stage)].note(start, end);
        state.gradients.note(start, end);
      }
    });
    result_.pipeline_end_s = std::max(result_.pipeline_end_s, end);
    complete(rank, kCompute, start, end, collectives);
  }

  // An idle compute stream waits on another stage (the bubble) until the transfer it needs has
  // begun; the transfer itself is exposed communication.
  void account_gap(RankState& state, double free, double start) {
    const double gap = start - free;
    if (gap <= 0) return;
    double transfer = 0;
    for (std::size_t i = 0; i < receives_waited_on_; ++i) {  // as dependencies_done just found them
      const std::size_t key = receive_keys_[i];
      if (keys_[key].done == start) transfer = std::max(transfer, start - std::max(keys_[key].started, free));
    }
    state.result.pipeline_comm_s += std::min(gap, transfer);
    state.result.idle_s += gap - std::min(gap, transfer);
  }

  bool start_optimizer(std::size_t rank) {
    RankState& state = ranks_[rank];
    const double free = state.free[kCompute];
    double ready = free;
    for (std::size_t stream = 0; stream < kStreams; ++stream) {
      if (stream == kCompute) continue;
      if (!at_end(rank, stream)) return false;
      ready = std::max(ready, state.free[stream]);
    }
    const double duration = costs_.optimizer[rank];
    // Waiting for the gradient reduction; what a last send holds beyond it is pipeline traffic.
    const double reduced = std::max(free, state.free[kDataParallel]);
    state.result.data_parallel_comm_s += reduced - free;
    state.result.pipeline_comm_s += ready - reduced;
    state.result.compute_s += duration;
    complete(rank, kCompute, ready, ready + duration);
    return true;
  }

  // Records that this side of a transfer is reached; the side that finds the other one there
  // begins the transfer for both, and the other rank is looked at again.
  bool reach_message(std::size_t rank, std::size_t stream, const Action& action) {
    RankState& state = ranks_[rank];
    const bool is_send = stream == kSend;
    const Action receive = is_send ? matching_receive(action) : action;
    const DependencyKey receive_key = dependency_key(receive);
    KeyTimes& transfer_times = keys_[index_(receive_key)];
    double reached = state.free[stream];
    if (is_send) {
      const double ready = dependencies_done(action, rank, stream);
      if (ready == kUnknown) return false;
      reached = std::max(reached, ready);
    }
    const std::optional<double> begins = reach_transfer(transfer_times, reached);
    if (!begins) {
      state.reached_head[stream] = true;
      return false;
    }
    const Action send = is_send ? action : matching_send(action);
    const StageCosts& sender_stage = costs_.stages[static_cast<std::size_t>(send.stage)];
    const double transfer =
        send.kind == ActionKind::kSendForward ? sender_stage.send_forward : sender_stage.send_backward;
    const double start = *begins;
    transfer_times = {start, start + transfer};
    const auto sender = static_cast<std::size_t>(stage_ranks_[static_cast<std::size_t>(send.stage)]);
    const auto receiver = static_cast<std::size_t>(stage_ranks_[static_cast<std::size_t>(receive.stage)]);
    complete(sender, kSend, start, start + transfer);
    complete(receiver, kReceive, start, start + transfer);
    look_again(is_send ? receiver : sender);
    return true;
  }

  // When the data-parallel stream's head reduction is issued: once its weight gradients are all
  // computed (with overlap, its stage's; without, the rank's), and not before the one before it.
  // kUnknown while one is outstanding.
  double reduction_issue_time(const RankState& state, const Action& reduction) const {
    const WeightGradients& gradients = costs_.overlapped_gradient_reduction
                                           ? stage_gradients_[static_cast<std::size_t>(reduction.stage)]
                                           : state.gradients;
    const int64_t needed = costs_.overlapped_gradient_reduction ? shape_.microbatches : state.weight_gradients;
    if (gradients.done < needed) return kUnknown;
    return std::max(state.reduction_issued, gradients.last_end);
  }

  // Issues the rank's reductions that are issued before compute whose dependencies are done at
  // `compute_ready`: those the compute so far runs beside (engine.h).
  void issue_reductions(std::size_t rank, double compute_ready) {
    RankState& state = ranks_[rank];
    while (!at_end(rank, kDataParallel)) {
      const Action& reduction = head_action(rank, kDataParallel);
      const double issued = reduction_issue_time(state, reduction);
      if (issued == kUnknown || !(issued <= compute_ready)) return;
      start_reduction(rank, reduction, issued);
    }
  }

  void start_reduction(std::size_t rank, const Action& reduction, double issued) {
    RankState& state = ranks_[rank];
    const WeightGradients& gradients = costs_.overlapped_gradient_reduction
                                           ? stage_gradients_[static_cast<std::size_t>(reduction.stage)]
                                           : state.gradients;
    // Without overlap every bucket waits for the rank's whole backward.
    const double last_start = costs_.overlapped_gradient_reduction ? gradients.last_start : gradients.last_end;
    const StageCosts& stage = costs_.stages[static_cast<std::size_t>(reduction.stage)];
    const BucketWindow window{state.free[kDataParallel], last_start, gradients.last_end, state.free[kCompute]};
    const BucketRun run = run_gradient_buckets(window, stage.gradient_buckets, stage.gradient_reduction_overlap);
    slow_compute_beside(state, run.extra);
    state.reduction_issued = issued;
    complete(rank, kDataParallel, run.start, run.end);
  }

  // The compute issued so far takes `extra` longer (what communication beside it cost).
  void slow_compute_beside(RankState& state, double extra) {
    if (extra <= 0) return;
    double& compute_free = state.free[kCompute];
    compute_free += extra;
    state.result.compute_s += extra;
    state.compute_busy_in_pipeline += extra;
    state.end = std::max(state.end, compute_free);
    result_.pipeline_end_s = std::max(result_.pipeline_end_s, compute_free);
  }

  [[gnu::noinline]] void finish() {  // once per run: kept out of the flattened loop
    double iteration = 0;
    int64_t events = 0;
    for (std::size_t rank = 0; rank < ranks_.size(); ++rank) {
      const RankState& state = ranks_[rank];
      for (std::size_t stream = 0; stream < kStreams; ++stream) {
        if (!at_end(rank, stream)) {
          throw SpecError("schedule", "simulation stalled on rank " + std::to_string(rank) + " at " +
                                          to_string(head_action(rank, stream)) + " (was the schedule validated?)");
        }
        if (stream != kSend) events += state.completed[stream];
      }
      iteration = std::max(iteration, state.end);
    }
    result_.iteration_time_s = iteration;
    result_.events = events;
    double idle_in_pipeline = 0;
    for (RankState& state : ranks_) {
      state.result.idle_s += iteration - state.end;
      idle_in_pipeline += result_.pipeline_end_s - state.compute_busy_in_pipeline;
      result_.ranks.push_back(state.result);
    }
    if (result_.pipeline_end_s > 0) {
      result_.bubble_fraction = idle_in_pipeline / (static_cast<double>(ranks_.size()) * result_.pipeline_end_s);
    }
    if (record_) record_timeline();
  }

  // Each rank's actions in its list's order.
  void record_timeline() {
    Timeline& timeline = result_.timeline;
    timeline.source = "simulated";
    for (std::size_t rank = 0; rank < ranks_.size(); ++rank) {
      const std::vector<Action>& actions = schedule_.ranks[rank];
      for (std::size_t step = 0; step < actions.size(); ++step) {
        const ActionRun& run = runs_[rank][step];
        timeline.slices.push_back({static_cast<int32_t>(rank), stream_of(actions[step].kind), actions[step], run.start,
                                   run.end, run.collectives});
      }
    }
  }

  const PipelineSchedule& schedule_;
  const ScheduleShape& shape_;
  const ActionCosts& costs_;
  const bool record_;
  const DependencySlots index_;
  const std::vector<int32_t> stage_ranks_;  // rank_of_each_stage(shape_)
  std::vector<KeyTimes> keys_;              // by DependencySlots; a receive's holds its transfer's rendezvous
  // The receives the last dependencies_done call met (an OVERLAP_F_B waits on two at most).
  std::array<std::size_t, 2> receive_keys_{};
  std::size_t receives_waited_on_ = 0;
  std::vector<WeightGradients> stage_gradients_;  // by stage
  std::vector<RankState> ranks_;
  std::vector<std::size_t> work_;             // ranks to look at again
  std::vector<std::vector<ActionRun>> runs_;  // by rank and step, when recording
  SimulationResult result_;
};

}  // namespace

SimulationResult simulate_schedule(const PipelineSchedule& schedule, const ActionCosts& costs, bool record_timeline) {
  return Engine(schedule, costs, record_timeline).run();
}

}  // namespace megaplan::sim
