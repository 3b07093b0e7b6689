// The event loop: completions come off the event queue in (time, issue) order; each wakes its rank's
// streams, which start every action whose stream is free and whose dependencies are done.
#include "simulator/engine.h"

#include <algorithm>
#include <array>
#include <optional>

#include "core/error.h"
#include "core/hot_loop.h"
#include "core/schedule/dependencies.h"
#include "simulator/dependency_slots.h"
#include "simulator/event_queue.h"
#include "simulator/transfer_rendezvous.h"

namespace megaplan::sim {

namespace {

constexpr double kUnknown = -1.0;
constexpr std::size_t kStreams = kTimelineStreamCount;

// Core's stream_of as the index of the engine's per-stream arrays.
constexpr std::size_t stream_index(ActionKind kind) { return static_cast<std::size_t>(stream_of(kind)); }

struct RankState {
  std::array<std::vector<uint32_t>, kStreams> queue;  // action indices per stream, in order
  std::array<std::size_t, kStreams> head{};
  std::array<double, kStreams> free{};
  std::array<std::size_t, kStreams> waiting_on{DependencySlots::kNone, DependencySlots::kNone, DependencySlots::kNone,
                                               DependencySlots::kNone};
  int64_t pending = 0;  // completions pushed but not yet taken off the heap
  double compute_busy_in_pipeline = 0;
  double end = 0;
  RankSimulation result;
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
        done_(index_.size(), kUnknown),
        started_(index_.size(), kUnknown),
        transfers_(index_.message_size()),
        weight_gradients_(static_cast<std::size_t>(shape_.num_stages)),
        ranks_(schedule.ranks.size()) {
    for (std::size_t rank = 0; rank < ranks_.size(); ++rank) {
      const auto& actions = schedule.ranks[rank];
      for (std::size_t i = 0; i < actions.size(); ++i) {
        ranks_[rank].queue[stream_index(actions[i].kind)].push_back(static_cast<uint32_t>(i));
      }
    }
    result_.timeline.source = "simulated";
  }

  // Flattened: the loop runs once per event, and the dependency rule, the key index and the
  // stream logic must inline into it (a third faster than calls at gpt-1t's 130k events).
  MEGAPLAN_HOT_LOOP SimulationResult run() {
    for (std::size_t rank = 0; rank < ranks_.size(); ++rank) wake(rank);
    drain();
    while (!queue_.finished()) {
      const Completion completion = queue_.next();
      const Action& action = schedule_.ranks[completion.rank][completion.step];
      for_each_provided_key(action, [&](const DependencyKey& key) {
        const std::size_t slot = index_(key);
        if (slot != DependencySlots::kNone) done_[slot] = completion.time;
        if (key.kind == ActionKind::kBackwardWeight) note_weight_gradient(key, completion.time);
      });
      --ranks_[completion.rank].pending;
      wake_waiters(completion);
      drain();
    }
    finish();
    return std::move(result_);
  }

 private:
  void wake(std::size_t rank) {
    for (std::size_t stream = 0; stream < kStreams; ++stream) work_.push_back({rank, stream});
  }

  // Advances (directly; pairings may queue more work) the streams that can wait on what a
  // completion provides. Streams only ever wait for a dependency's completion (an issued action's start is known at
  // once), so a completion wakes the streams that can wait on what it provides: computations feed
  // the rank's compute, send and data-parallel streams, a receive its compute stream; and the
  // rank's last completion lets OPTIM start.
  void wake_waiters(const Completion& completion) {
    const std::size_t rank = completion.rank;
    const auto advance_stream = [&](TimelineStream stream) { advance(rank, static_cast<std::size_t>(stream)); };
    switch (stream_of(schedule_.ranks[rank][completion.step].kind)) {
      case TimelineStream::kCompute: {
        advance_stream(TimelineStream::kCompute);
        advance_stream(TimelineStream::kSend);
        const ActionKind kind = schedule_.ranks[rank][completion.step].kind;
        if (kind != ActionKind::kForward && kind != ActionKind::kBackwardInput)
          advance_stream(TimelineStream::kDataParallel);
        return;
      }
      case TimelineStream::kReceive: advance_stream(TimelineStream::kCompute); return;
      case TimelineStream::kSend:
      case TimelineStream::kDataParallel:
        if (ranks_[rank].pending == 0) advance_stream(TimelineStream::kCompute);
        return;
    }
  }

  void drain() {
    while (!work_.empty()) {
      const auto [rank, stream] = work_.back();
      work_.pop_back();
      advance(rank, stream);
    }
  }

  const Action& head_action(std::size_t rank, std::size_t stream) const {
    const RankState& state = ranks_[rank];
    return schedule_.ranks[rank][state.queue[stream][state.head[stream]]];
  }

  // Latest completion among the action's dependencies, or kUnknown while one is outstanding.
  // An outstanding dependency is remembered as what the stream waits on, so that wakes by other
  // completions cost one look-up.
  double dependencies_done(const Action& action, std::size_t rank, std::size_t stream) {
    double ready = 0;
    std::size_t missing = DependencySlots::kNone;
    receives_waited_on_ = 0;
    for_each_dependency(action, shape_, /*lowered=*/true, [&](const Action& needed) {
      const std::size_t key = index_(dependency_key(needed));
      const double done = done_[key];
      if (done == kUnknown) missing = key;
      ready = std::max(ready, done);
      const bool receive = needed.kind == ActionKind::kRecvForward || needed.kind == ActionKind::kRecvBackward;
      if (receive && receives_waited_on_ < receive_keys_.size()) receive_keys_[receives_waited_on_++] = key;
    });
    if (missing == DependencySlots::kNone) return ready;
    ranks_[rank].waiting_on[stream] = missing;
    return kUnknown;
  }

  void advance(std::size_t rank, std::size_t stream) {
    RankState& state = ranks_[rank];
    std::size_t& waiting_on = state.waiting_on[stream];
    if (waiting_on != DependencySlots::kNone) {
      if (done_[waiting_on] == kUnknown) return;
      waiting_on = DependencySlots::kNone;
    }
    while (state.head[stream] < state.queue[stream].size()) {
      const Action& action = head_action(rank, stream);
      bool started = false;
      switch (static_cast<TimelineStream>(stream)) {
        case TimelineStream::kCompute:
          started = action.kind == ActionKind::kOptimizer ? start_optimizer(rank) : start_compute(rank, action);
          break;
        case TimelineStream::kSend:
        case TimelineStream::kReceive: started = reach_message(rank, stream, action); break;
        case TimelineStream::kDataParallel: started = start_reduction(rank, action); break;
      }
      if (!started) return;
    }
  }

  // The head of `stream` on `rank` runs from start to end. Its completion goes on the heap,
  // except a send's: nothing waits for one (its receive completes with it, and OPTIM reads the
  // send stream's end directly).
  void complete(std::size_t rank, std::size_t stream, double start, double end, double collectives = 0) {
    RankState& state = ranks_[rank];
    const uint32_t step = state.queue[stream][state.head[stream]];
    if (stream != static_cast<std::size_t>(TimelineStream::kSend)) {
      queue_.schedule(end, static_cast<uint32_t>(rank), step);
      ++state.pending;
    }
    state.free[stream] = end;
    ++state.head[stream];
    state.end = std::max(state.end, end);
    if (record_) {
      result_.timeline.slices.push_back({static_cast<int32_t>(rank), static_cast<TimelineStream>(stream),
                                         schedule_.ranks[rank][step], start, end, collectives});
    }
  }

  double compute_seconds(const Action& part, double& collectives) const {
    const StageCosts& stage = costs_.stages[static_cast<std::size_t>(part.stage)];
    switch (part.kind) {
      case ActionKind::kForward: collectives += stage.forward_collectives; return stage.forward;
      case ActionKind::kBackward: collectives += stage.backward_collectives; return stage.backward;
      case ActionKind::kBackwardInput: collectives += stage.backward_collectives; return stage.backward_input;
      default:  // kBackwardWeight
        return stage.backward_weight;
    }
  }

  bool start_compute(std::size_t rank, const Action& action) {
    const std::size_t stream = static_cast<std::size_t>(TimelineStream::kCompute);
    const double ready = dependencies_done(action, rank, stream);
    if (ready == kUnknown) return false;
    RankState& state = ranks_[rank];
    const double free = state.free[stream];
    const double start = std::max(free, ready);
    double collectives = 0;
    double duration = 0;
    for (const Action& part : parts_of(action)) duration += compute_seconds(part, collectives);
    account_gap(state, free, start);
    state.result.compute_s += duration - collectives;
    state.result.collective_s += collectives;
    state.compute_busy_in_pipeline += duration;
    for_each_provided_key(action, [&](const DependencyKey& key) { started_[index_(key)] = start; });  // F, I, W
    result_.pipeline_end_s = std::max(result_.pipeline_end_s, start + duration);
    complete(rank, stream, start, start + duration, collectives);
    return true;
  }

  // An idle compute stream waits on another stage (the bubble) until the transfer it needs has
  // begun; the transfer itself is exposed communication.
  void account_gap(RankState& state, double free, double start) {
    const double gap = start - free;
    if (gap <= 0) return;
    double transfer = 0;
    for (std::size_t i = 0; i < receives_waited_on_; ++i) {  // as dependencies_done just found them
      const std::size_t key = receive_keys_[i];
      if (done_[key] == start) transfer = std::max(transfer, start - std::max(started_[key], free));
    }
    state.result.pipeline_comm_s += std::min(gap, transfer);
    state.result.idle_s += gap - std::min(gap, transfer);
  }

  bool start_optimizer(std::size_t rank) {
    RankState& state = ranks_[rank];
    const std::size_t compute = static_cast<std::size_t>(TimelineStream::kCompute);
    const double free = state.free[compute];
    double ready = free;
    for (std::size_t stream = 0; stream < kStreams; ++stream) {
      if (stream == compute) continue;
      if (state.head[stream] < state.queue[stream].size()) return false;
      ready = std::max(ready, state.free[stream]);
    }
    if (state.pending > 0) return false;  // everything before OPTIM has completed
    const double duration = costs_.optimizer[rank];
    // Waiting for the gradient reduction; what a last send holds beyond it is pipeline traffic.
    const double reduced = std::max(free, state.free[static_cast<std::size_t>(TimelineStream::kDataParallel)]);
    state.result.data_parallel_comm_s += reduced - free;
    state.result.pipeline_comm_s += ready - reduced;
    state.result.compute_s += duration;
    complete(rank, compute, ready, ready + duration);
    return true;
  }

  // Records that this side of a transfer is reached; the side that finds the other one waiting
  // starts the transfer for both.
  bool reach_message(std::size_t rank, std::size_t stream, const Action& action) {
    RankState& state = ranks_[rank];
    const bool is_send = stream == static_cast<std::size_t>(TimelineStream::kSend);
    const Action receive = is_send ? matching_receive(action) : action;
    const DependencyKey receive_key = dependency_key(receive);
    const std::size_t message = index_.message(receive_key);
    std::optional<double> begins;
    if (is_send) {
      const double ready = dependencies_done(action, rank, stream);
      if (ready == kUnknown) return false;
      begins = transfers_.reach_send(message, std::max(state.free[stream], ready));
    } else {
      begins = transfers_.reach_receive(message, state.free[stream]);
    }
    if (!begins) return false;
    const Action send = is_send ? action : matching_send(action);
    const StageCosts& sender_stage = costs_.stages[static_cast<std::size_t>(send.stage)];
    const double transfer =
        send.kind == ActionKind::kSendForward ? sender_stage.send_forward : sender_stage.send_backward;
    const double start = *begins;
    started_[index_(receive_key)] = start;
    const auto sender = static_cast<std::size_t>(stage_ranks_[static_cast<std::size_t>(send.stage)]);
    const auto receiver = static_cast<std::size_t>(stage_ranks_[static_cast<std::size_t>(receive.stage)]);
    complete(sender, static_cast<std::size_t>(TimelineStream::kSend), start, start + transfer);
    complete(receiver, static_cast<std::size_t>(TimelineStream::kReceive), start, start + transfer);
    // The other side's stream moved on too; the sender's OPTIM may be waiting for this send.
    if (is_send) {
      work_.push_back({receiver, static_cast<std::size_t>(TimelineStream::kReceive)});
    } else {
      work_.push_back({sender, static_cast<std::size_t>(TimelineStream::kSend)});
    }
    work_.push_back({sender, static_cast<std::size_t>(TimelineStream::kCompute)});
    return true;
  }

  // Counts a stage's finished weight gradients and keeps the latest, whose run fills the buckets.
  void note_weight_gradient(const DependencyKey& key, double time) {
    WeightGradients& stage = weight_gradients_[static_cast<std::size_t>(key.stage)];
    ++stage.done;
    if (time >= stage.last_end) {
      stage.last_end = time;
      stage.last_start = started_[index_(key)];
    }
  }

  bool start_reduction(std::size_t rank, const Action& action) {
    const WeightGradients& gradients = weight_gradients_[static_cast<std::size_t>(action.stage)];
    if (gradients.done < shape_.microbatches) return false;
    double last_end = gradients.last_end;
    double last_start = gradients.last_start;
    if (!costs_.overlapped_gradient_reduction) {
      // Every bucket waits for the rank's whole backward: all its stages' gradients.
      for (std::size_t stage = 0; stage < weight_gradients_.size(); ++stage) {
        if (static_cast<std::size_t>(stage_ranks_[stage]) != rank) continue;
        if (weight_gradients_[stage].done < shape_.microbatches) return false;
        last_end = std::max(last_end, weight_gradients_[stage].last_end);
      }
      last_start = last_end;
    }
    RankState& state = ranks_[rank];
    const std::size_t stream = static_cast<std::size_t>(TimelineStream::kDataParallel);
    const StageCosts& stage = costs_.stages[static_cast<std::size_t>(action.stage)];
    const BucketWindow window{state.free[stream], last_start, last_end,
                              state.free[static_cast<std::size_t>(TimelineStream::kCompute)]};
    const BucketRun run = run_gradient_buckets(window, stage.gradient_buckets, stage.gradient_reduction_overlap);
    slow_compute_beside(state, run.extra);
    complete(rank, stream, run.start, run.end);
    return true;
  }

  // The compute stream's work issued so far takes `extra` longer (what communication beside it cost).
  void slow_compute_beside(RankState& state, double extra) {
    if (extra <= 0) return;
    double& compute_free = state.free[static_cast<std::size_t>(TimelineStream::kCompute)];
    compute_free += extra;
    state.result.compute_s += extra;
    state.compute_busy_in_pipeline += extra;
    state.end = std::max(state.end, compute_free);
    result_.pipeline_end_s = std::max(result_.pipeline_end_s, compute_free);
  }

  [[gnu::noinline]] void finish() {  // once per run: kept out of the flattened loop
    double iteration = 0;
    for (std::size_t rank = 0; rank < ranks_.size(); ++rank) {
      const RankState& state = ranks_[rank];
      for (std::size_t stream = 0; stream < kStreams; ++stream) {
        if (state.head[stream] != state.queue[stream].size()) {
          throw SpecError("schedule", "simulation stalled on rank " + std::to_string(rank) + " at " +
                                          to_string(head_action(rank, stream)) + " (was the schedule validated?)");
        }
      }
      iteration = std::max(iteration, state.end);
    }
    result_.iteration_time_s = iteration;
    result_.events = queue_.taken();
    double idle_in_pipeline = 0;
    for (RankState& state : ranks_) {
      state.result.idle_s += iteration - state.end;
      idle_in_pipeline += result_.pipeline_end_s - state.compute_busy_in_pipeline;
      result_.ranks.push_back(state.result);
    }
    if (result_.pipeline_end_s > 0) {
      result_.bubble_fraction = idle_in_pipeline / (static_cast<double>(ranks_.size()) * result_.pipeline_end_s);
    }
  }

  const PipelineSchedule& schedule_;
  const ScheduleShape& shape_;
  const ActionCosts& costs_;
  const bool record_;
  const DependencySlots index_;
  const std::vector<int32_t> stage_ranks_;  // rank_of_each_stage(shape_)
  std::vector<double> done_;                // by key: when the providing action completed
  std::vector<double> started_;             // by key: when it started (transfers: when the transfer began)
  TransferRendezvous transfers_;            // by DependencySlots::message
  // The receives the last dependencies_done call met (an OVERLAP_F_B waits on two at most).
  std::array<std::size_t, 2> receive_keys_{};
  std::size_t receives_waited_on_ = 0;
  struct WeightGradients {
    int64_t done = 0;
    double last_start = 0;
    double last_end = 0;
  };
  std::vector<WeightGradients> weight_gradients_;  // by stage
  std::vector<RankState> ranks_;
  EventQueue queue_;
  std::vector<std::pair<std::size_t, std::size_t>> work_;  // (rank, stream) to advance
  SimulationResult result_;
};

}  // namespace

SimulationResult simulate_schedule(const PipelineSchedule& schedule, const ActionCosts& costs, bool record_timeline) {
  return Engine(schedule, costs, record_timeline).run();
}

}  // namespace megaplan::sim
