// Interpreter: performs one pipeline rank's lowered action list from core/schedule — the list the
// simulator costed — once per iteration, and records what each action took in core's Timeline.
//
// Semantics, as simulator/engine.h describes them for the simulated run:
// - Actions are issued in list order. F, B, I, W and OVERLAP_F_B run the rank's stage chunks; an
//   OVERLAP_F_B of two chunks issues its backward, then its forward through Backend::run_pair (on
//   a second stream on the GPU, so the two may overlap; one after the other on the CPU), and of
//   one chunk its forward, then its backward; SEND_*/RECV_* are point-to-point calls on the pipeline group in
//   list order (the lowering pairs them), receiving straight into the consuming stage's input
//   buffer or a gradient buffer; a computation waits for the receive it consumes, and a buffer
//   being sent is kept until the send completes. Stages on one rank (a V's turn) hand activations
//   and gradients over without a message.
// - REDUCE_GRAD(s) reduces stage s's gradient buckets over the data-parallel group; OPTIM waits
//   for every send, checks the gradient norm, clips and steps (optimizer.h).
// - The loss scale of every backward is 1 / (microbatches x data-parallel size): summed over the
//   microbatches and the replicas, the gradients are those of the global batch's mean loss; times
//   the loss scaler's scale under fp16 (IterationStep), divided out again at OPTIM.
// - Timing: each action's slice runs from a backend timing mark taken before it to one taken after
//   it (Backend::mark), in seconds from the iteration's first mark: the host's steady clock on the
//   CPU, where work is done when issued; CUDA events on the GPU's stream, so a slice is when the
//   GPU ran the action, not when the host queued it (an OVERLAP_F_B's slice ends when both of its
//   streams are done). Ranks that share one GPU each have their own streams, so a slice there also
//   includes the time the GPU gave other ranks' work meanwhile (the in-process one-GPU
//   communicator's copies and reductions included). Marks are taken only when a timeline is asked
//   for, and read after the iteration's last action (which waits for the GPU to finish it).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "core/schedule/schedule.h"
#include "core/timeline.h"
#include "executor/comm/comm.h"
#include "executor/model/stage_chunk.h"
#include "executor/runtime/backend.h"
#include "executor/train/optimizer.h"

namespace megaplan::exec {

// What one iteration does beside its data.
struct IterationStep {
  int64_t iteration = 1;  // for messages
  int64_t update = 1;     // Adam's step: the updates done before this one, plus one
  double lr = 0;
  // A loss scaler's scale (executor/train/loss_scaler.h): every backward's loss is multiplied by
  // it, and the gradients divided by it again before the norm, the clipping and the step.
  double loss_scale = 1;
  // Under loss scaling, gradients that overflow skip the update (IterationResult::skipped) instead
  // of stopping the run.
  bool skip_overflow = false;
  // The global sample of microbatch m's first sequence (its place in the run's sample order), where
  // dropout's masks are drawn (StageChunk::forward); empty: sample 0.
  std::function<int64_t(int64_t microbatch)> first_sample;
};

struct IterationResult {
  double loss_sum = 0;         // the last stage's microbatch losses, summed (0 on other ranks)
  double gradient_norm = 0;    // of the unscaled gradients, before clipping
  RouterLosses router_losses;  // the rank's MoE layers', summed over layers and microbatches
  bool skipped = false;        // the gradients overflowed under loss scaling: no update was made
};

class Interpreter {
 public:
  // `chunks` by virtual stage: every stage core places on `pipeline_rank`. `pipeline` is the
  // rank's pp group (null when pp = 1). REQUIRES: schedule.lowered, validate_schedule passed.
  Interpreter(const PipelineSchedule& schedule, int64_t pipeline_rank, std::map<int64_t, StageChunk*> chunks,
              Comm* pipeline, int64_t data_parallel_size, Optimizer& optimizer, Backend& backend);
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // From the next iteration on, walk `schedule` (another microbatch count of the same pipeline: a
  // --rampup-batch-size step), scaling the loss by its microbatches. Kept by reference.
  // REQUIRES: lowered, validated, the constructor's pp, stages and placement; between iterations.
  void use_schedule(const PipelineSchedule& schedule);

  // One iteration. `data(m)` is microbatch m's tokens (asked on the first and last stage only).
  // Slices are appended to `timeline` when it is not null (see Timing above). Throws SpecError
  // naming the step and the first non-finite gradient when the gradient norm is not finite (and
  // the step does not skip overflows, or the loss itself is not finite), before the optimizer
  // touches the weights.
  IterationResult run(const IterationStep& step, const std::function<const MicrobatchTokens&(int64_t)>& data,
                      Timeline* timeline);

 private:
  struct Key {
    int64_t stage, microbatch;
    auto operator<=>(const Key&) const = default;
  };
  struct Held {  // a message buffer, and the request still using it
    Activation buffer = nullptr;
    Request request;
  };
  void execute(const Action& action, const IterationStep& step,
               const std::function<const MicrobatchTokens&(int64_t)>& data, IterationResult& result);
  // OPTIM's checks and the step (or its skip).
  void optimize(const IterationStep& step, IterationResult& result);
  // F, and B or I (`defer`: the weight gradient waits for W), their inputs found by core's
  // dependencies().
  void forward(const Action& action, const IterationStep& step,
               const std::function<const MicrobatchTokens&(int64_t)>& data);
  void backward(const Action& action, bool defer);
  // One slice per action; marks[i] was taken before actions_[i] and marks[i + 1] after it.
  void record(const std::vector<TimingMark>& marks, Timeline& timeline);
  StageChunk& chunk(int64_t stage);
  int64_t peer(int64_t stage) const;  // the pp group rank of a stage
  void wait(std::map<Key, Request>& pending, Key key);
  // Message buffers (received inputs, gradients), pooled: every message of a rank has one size.
  Activation message_buffer();
  void release(Activation buffer);

  const std::vector<Action>* actions_ = nullptr;  // the schedule's list for this rank
  ScheduleShape shape_;
  int64_t pipeline_rank_;
  std::map<int64_t, StageChunk*> chunks_;
  Comm* pipeline_;
  int64_t data_parallel_size_;
  float microbatch_loss_scale_ = 1;  // 1 / (microbatches x data-parallel size)
  float loss_scale_ = 1;             // this iteration's: that times IterationStep::loss_scale
  Optimizer& optimizer_;
  Backend& backend_;
  std::map<Key, Held> receives_;          // RECV_F's message until its F copies it in, by the stage it feeds
  std::map<Key, Request> sends_;          // SEND_F in flight: the output stays until it is done
  std::map<Key, Held> output_gradients_;  // received or handed over (RECV_B, a local B), by the stage that reads it
  std::map<Key, Held> input_gradients_;   // written by B/I of a stage, until sent (SEND_B) or handed over
  std::vector<Held> sent_;                // SEND_B buffers until OPTIM
  std::vector<Activation> spare_messages_;
};

}  // namespace megaplan::exec
