#include "executor/runtime/interpreter.h"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "core/error.h"
#include "core/schedule/dependencies.h"

namespace megaplan::exec {

namespace {

// Releases the backend's timing marks however the iteration ends (a non-finite loss throws).
class MarksReleased {
 public:
  explicit MarksReleased(Backend& backend) : backend_(backend) {}
  ~MarksReleased() { backend_.release_marks(); }
  MarksReleased(const MarksReleased&) = delete;
  MarksReleased& operator=(const MarksReleased&) = delete;

 private:
  Backend& backend_;
};

}  // namespace

Interpreter::Interpreter(const PipelineSchedule& schedule, int64_t pipeline_rank, std::map<int64_t, StageChunk*> chunks,
                         Comm* pipeline, int64_t data_parallel_size, Optimizer& optimizer, Backend& backend)
    : shape_(schedule.shape),
      pipeline_rank_(pipeline_rank),
      chunks_(std::move(chunks)),
      pipeline_(pipeline),
      data_parallel_size_(data_parallel_size),
      optimizer_(optimizer),
      backend_(backend) {
  if (shape_.pipeline_parallel_size > 1 && !pipeline_) throw std::logic_error("Interpreter: pp > 1 without a group");
  use_schedule(schedule);
}

void Interpreter::use_schedule(const PipelineSchedule& schedule) {
  if (!schedule.lowered) throw std::logic_error("Interpreter: the schedule is not lowered");
  if (schedule.shape.pipeline_parallel_size != shape_.pipeline_parallel_size ||
      schedule.shape.num_stages != shape_.num_stages || schedule.shape.placement != shape_.placement) {
    throw std::logic_error("Interpreter: a schedule of another pipeline");
  }
  actions_ = &schedule.ranks.at(static_cast<std::size_t>(pipeline_rank_));
  shape_ = schedule.shape;
  microbatch_loss_scale_ = 1.0f / static_cast<float>(schedule.shape.microbatches * data_parallel_size_);
}

Interpreter::~Interpreter() {
  for (Activation buffer : spare_messages_) backend_.release(buffer);
}

StageChunk& Interpreter::chunk(int64_t stage) {
  const auto found = chunks_.find(stage);
  if (found == chunks_.end()) {
    throw std::logic_error("Interpreter: stage " + std::to_string(stage) + " is not on pipeline rank " +
                           std::to_string(pipeline_rank_));
  }
  return *found->second;
}

int64_t Interpreter::peer(int64_t stage) const { return shape_.rank_of_stage(stage); }

void Interpreter::wait(std::map<Key, Request>& pending, Key key) {
  const auto found = pending.find(key);
  if (found == pending.end()) return;
  found->second->wait();
  pending.erase(found);
}

Activation Interpreter::message_buffer() {
  if (!spare_messages_.empty()) {
    Activation buffer = spare_messages_.back();
    spare_messages_.pop_back();
    return buffer;
  }
  return backend_.allocate_activation(chunks_.begin()->second->message_size());
}

void Interpreter::release(Activation buffer) { spare_messages_.push_back(buffer); }

void Interpreter::forward(const Action& action, const IterationStep& step,
                          const std::function<const MicrobatchTokens&(int64_t)>& data) {
  const int64_t stage = action.stage, microbatch = action.microbatch;
  StageChunk& model = chunk(stage);
  optimizer_.parameters_ready(stage);  // the last step's parameter all-gather, if it still runs
  // The input, as core's dependency rule names it: the previous stage's output on this rank, or
  // RECV_F's message.
  for_each_dependency(action, shape_, /*lowered=*/true, [&](const Action& needed) {
    if (needed.kind == ActionKind::kForward) {
      backend_.copy(chunk(needed.stage).output(microbatch), model.message_size(), model.input_buffer(microbatch));
      return;
    }
    // Received into a message buffer, not the microbatch's set: the set is taken only now, so a
    // RECV_F posted a step ahead (the lowering's order) holds one message, not a set.
    const auto found = receives_.find({needed.stage, needed.microbatch});
    if (found == receives_.end()) throw std::logic_error("Interpreter: a forward without its RECV_F");
    found->second.request->wait();
    backend_.copy(found->second.buffer, model.message_size(), model.input_buffer(microbatch));
    release(found->second.buffer);
    receives_.erase(found);
  });
  const MicrobatchTokens* tokens = model.first_stage() || model.last_stage() ? &data(microbatch) : nullptr;
  model.forward(microbatch, tokens, step.first_sample ? step.first_sample(microbatch) : 0);
}

void Interpreter::backward(const Action& action, bool defer) {
  const int64_t stage = action.stage, microbatch = action.microbatch;
  StageChunk& model = chunk(stage);
  Activation output_gradient = nullptr;
  // The output gradient, as core's dependency rule names it: the next stage's input gradient
  // handed over on this rank (its B or I), or RECV_B's message. The forward ran before, here.
  for_each_dependency(action, shape_, /*lowered=*/true, [&](const Action& needed) {
    if (needed.kind == ActionKind::kForward) return;
    auto& source = needed.kind == ActionKind::kRecvBackward ? output_gradients_ : input_gradients_;
    const auto found = source.find({needed.stage, needed.microbatch});
    if (found == source.end()) throw std::logic_error("Interpreter: a backward without its output gradient");
    if (found->second.request) found->second.request->wait();
    output_gradient = found->second.buffer;
    source.erase(found);
  });
  if (!model.last_stage() && output_gradient == nullptr) {
    throw std::logic_error("Interpreter: a backward without its output gradient");
  }
  wait(sends_, {stage, microbatch});  // the backward releases the output being sent
  Activation input_gradient = model.first_stage() ? nullptr : message_buffer();
  model.backward_input(microbatch, output_gradient, loss_scale_, input_gradient, defer);
  if (output_gradient) release(output_gradient);
  if (input_gradient) input_gradients_[{stage, microbatch}] = Held{input_gradient, nullptr};
}

void Interpreter::execute(const Action& action, const IterationStep& step,
                          const std::function<const MicrobatchTokens&(int64_t)>& data, IterationResult& result) {
  const int64_t s = action.stage, m = action.microbatch;
  const DType type = backend_.activation_type();
  switch (action.kind) {
    case ActionKind::kForward: forward(action, step, data); break;
    case ActionKind::kBackward: backward(action, false); break;
    case ActionKind::kBackwardInput: backward(action, true); break;
    case ActionKind::kBackwardWeight: chunk(s).backward_weight(m); break;
    case ActionKind::kOverlapForwardBackward: {
      const ActionParts parts = parts_of(action);
      const Action& forward_part = parts.parts[0];
      const Action& backward_part = parts.parts[1];
      const auto run = [&](const Action& part) { execute(part, step, data, result); };
      if (forward_part.stage == backward_part.stage) {
        // One chunk's scratch serves its F and B alike (StageChunk): one after the other.
        run(forward_part);
        run(backward_part);
      } else {
        // Two chunks touch disjoint buffers: the backward, and beside it (a second stream on the
        // GPU) the forward, issued second so that a host wait inside it (the loss) holds up
        // nothing already queued.
        backend_.run_pair([&] { run(backward_part); }, [&] { run(forward_part); });
      }
      break;
    }
    case ActionKind::kRecvForward: {
      Activation buffer = message_buffer();
      Request request = pipeline_->recv(buffer, chunk(s).message_size(), type, peer(s - 1));
      receives_[{s, m}] = Held{buffer, std::move(request)};
      break;
    }
    case ActionKind::kSendForward: {
      StageChunk& model = chunk(s);
      sends_[{s, m}] = pipeline_->send(model.output(m), model.message_size(), type, peer(s + 1));
      break;
    }
    case ActionKind::kRecvBackward: {
      Activation buffer = message_buffer();
      Request request = pipeline_->recv(buffer, chunk(s).message_size(), type, peer(s + 1));
      output_gradients_[{s, m}] = Held{buffer, std::move(request)};
      break;
    }
    case ActionKind::kSendBackward: {
      const auto found = input_gradients_.find({s, m});
      if (found == input_gradients_.end()) throw std::logic_error("Interpreter: SEND_B before its backward");
      Held held = std::move(found->second);
      input_gradients_.erase(found);
      held.request = pipeline_->send(held.buffer, chunk(s).message_size(), type, peer(s - 1));
      sent_.push_back(std::move(held));
      break;
    }
    case ActionKind::kReduceGrad: optimizer_.reduce_gradients(s); break;
    case ActionKind::kOptimizer: optimize(step, result); break;
  }
}

void Interpreter::optimize(const IterationStep& step, IterationResult& result) {
  for (auto& [key, request] : sends_) request->wait();
  sends_.clear();
  for (Held& held : sent_) {
    held.request->wait();
    release(held.buffer);
  }
  sent_.clear();
  if (!receives_.empty() || !output_gradients_.empty() || !input_gradients_.empty()) {
    throw std::logic_error("Interpreter: messages left over at OPTIM");
  }
  // The losses stayed on the backend; the one wait for them is here, with the norm's.
  for (const auto& [stage, model] : chunks_) {
    if (model->last_stage()) result.loss_sum += model->take_loss_sum();
    result.router_losses += model->take_router_losses();
  }
  optimizer_.update_expert_biases();
  // Every rank of the model sees the same norm (its reduction spans them), so all skip together.
  result.gradient_norm = optimizer_.gradient_norm() / step.loss_scale;
  const std::string at = "iteration " + std::to_string(step.iteration);
  if (!std::isfinite(result.gradient_norm)) {
    if (step.skip_overflow && std::isfinite(result.loss_sum)) {
      optimizer_.skip();
      result.skipped = true;
      return;
    }
    const std::string culprit = optimizer_.first_non_finite_gradient();
    std::ostringstream norm;
    norm << result.gradient_norm;
    throw SpecError("loss", at + ": the gradient norm is " + norm.str() +
                                (culprit.empty() ? std::string(" (every gradient on pipeline rank ") +
                                                       std::to_string(pipeline_rank_) + " is finite)"
                                                 : " and the first non-finite gradient on pipeline rank " +
                                                       std::to_string(pipeline_rank_) + " is " + culprit) +
                                "; stopped before the optimizer step, the last checkpoint is untouched");
  }
  if (!std::isfinite(result.loss_sum)) {
    std::ostringstream loss;
    loss << result.loss_sum;
    throw SpecError("loss", at + ": the loss is " + loss.str() +
                                "; stopped before the optimizer step, the last checkpoint is untouched");
  }
  optimizer_.step(step.update, step.lr, result.gradient_norm, 1.0 / step.loss_scale);
}

IterationResult Interpreter::run(const IterationStep& step, const std::function<const MicrobatchTokens&(int64_t)>& data,
                                 Timeline* timeline) {
  IterationResult result;
  loss_scale_ = static_cast<float>(step.loss_scale) * microbatch_loss_scale_;
  if (!timeline) {
    for (const Action& action : *actions_) execute(action, step, data, result);
    return result;
  }
  const MarksReleased released(backend_);
  // marks[i] is taken before action i and marks[i + 1] after it: nothing of this rank's reaches
  // the backend between one action's end and the next one's start.
  std::vector<TimingMark> marks;
  marks.reserve(actions_->size() + 1);
  marks.push_back(backend_.mark());
  for (const Action& action : *actions_) {
    execute(action, step, data, result);
    marks.push_back(backend_.mark());
  }
  record(marks, *timeline);  // after the last action, so that reading the marks delays none of them
  return result;
}

void Interpreter::record(const std::vector<TimingMark>& marks, Timeline& timeline) {
  for (std::size_t i = 0; i < actions_->size(); ++i) {
    TimelineSlice slice;
    slice.pipeline_rank = static_cast<int32_t>(pipeline_rank_);
    slice.stream = stream_of((*actions_)[i].kind);
    slice.action = (*actions_)[i];
    slice.start_s = backend_.seconds_between(marks.front(), marks[i]);
    slice.end_s = backend_.seconds_between(marks.front(), marks[i + 1]);
    timeline.slices.push_back(slice);
  }
}

}  // namespace megaplan::exec
