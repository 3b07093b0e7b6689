// Zero-bubble schedules (Qi et al., "Zero Bubble Pipeline Parallelism", arXiv 2401.10241): the
// backward split into I (input gradient, on the critical path) and W (weight gradient, deferred
// to fill bubbles). The orders follow torch.distributed.pipelining, so a schedule megaplan plans
// is the one torchtitan would run.
#include <algorithm>
#include <deque>

#include "core/schedule/generators.h"

namespace megaplan {

std::vector<Action> zero_bubble_h1_schedule(int64_t pipeline_parallel_size, int64_t microbatches, int64_t rank) {
  // 1F1B's warm-up; rank r then delays its weight gradients by r steps, which fills the cool-down
  // bubble while holding at most pp microbatches, 1F1B's peak.
  const int64_t warmup = std::min(pipeline_parallel_size - 1 - rank, microbatches);
  const int64_t weight_delay = rank;
  std::vector<Action> actions;
  actions.reserve(static_cast<std::size_t>(3 * microbatches));
  int64_t next_forward = 0;
  int64_t next_input_gradient = 0;
  int64_t next_weight_gradient = 0;
  for (; next_forward < warmup; ++next_forward) actions.push_back(forward(rank, next_forward));
  for (int64_t step = 0; step < microbatches; ++step) {
    if (next_forward < microbatches) actions.push_back(forward(rank, next_forward++));
    actions.push_back(backward_input(rank, next_input_gradient++));
    if (step >= weight_delay) actions.push_back(backward_weight(rank, next_weight_gradient++));
  }
  while (next_weight_gradient < microbatches) actions.push_back(backward_weight(rank, next_weight_gradient++));
  return actions;
}

std::vector<Action> zero_bubble_v_schedule(int64_t pipeline_parallel_size, int64_t microbatches, int64_t rank) {
  const int64_t pp = pipeline_parallel_size;
  // The phases are laid out for at least 2pp - 1 microbatches; work on the ones beyond M is
  // dropped afterwards, as torch does.
  const int64_t planned = std::max(2 * pp - 1, microbatches);
  const int64_t chunk0 = rank;               // the V's way down
  const int64_t chunk1 = 2 * pp - 1 - rank;  // and back up
  int64_t f0 = 0, f1 = 0, b0 = 0, b1 = 0;
  std::vector<Action> actions;
  actions.reserve(static_cast<std::size_t>(6 * planned));
  for (int64_t i = 0; i < 2 * (pp - rank) - 1; ++i) actions.push_back(forward(chunk0, f0++));
  for (int64_t i = 0; i < rank; ++i) {
    actions.push_back(forward(chunk1, f1++));
    actions.push_back(forward(chunk0, f0++));
  }
  for (int64_t i = 0; i < pp - rank; ++i) {
    actions.push_back(forward(chunk1, f1++));
    actions.push_back(backward_input(chunk1, b1));
    actions.push_back(backward_weight(chunk1, b1++));
  }
  while (f1 < f0 || f0 < planned) {
    if (f0 < planned) actions.push_back(forward(chunk0, f0++));
    actions.push_back(backward_input(chunk0, b0));
    actions.push_back(backward_weight(chunk0, b0++));
    actions.push_back(forward(chunk1, f1++));
    actions.push_back(backward_input(chunk1, b1));
    actions.push_back(backward_weight(chunk1, b1++));
  }
  int64_t w0 = b0, w1 = b1;
  for (int64_t i = 0; i < rank; ++i) {
    actions.push_back(backward_input(chunk0, b0++));
    actions.push_back(backward_input(chunk1, b1++));
  }
  for (int64_t i = 0; i < pp - rank; ++i) {
    actions.push_back(backward_input(chunk0, b0++));
    actions.push_back(backward_weight(chunk0, w0++));
  }
  while (w1 < b1) actions.push_back(backward_weight(chunk1, w1++));
  while (w0 < b0) actions.push_back(backward_weight(chunk0, w0++));
  std::erase_if(actions, [&](const Action& action) { return action.microbatch >= microbatches; });
  return actions;
}

std::vector<Action> dual_pipe_v_schedule(int64_t pipeline_parallel_size, int64_t microbatches, int64_t rank) {
  const int64_t pp = pipeline_parallel_size;
  const int64_t chunk0 = rank;
  const int64_t chunk1 = 2 * pp - 1 - rank;
  // Per chunk: the next forward and the next backward microbatch; a B counts as both I and W.
  int64_t next_forward[2] = {0, 0};
  int64_t next_backward[2] = {0, 0};
  std::deque<Action> pending_weights;  // weight gradients owed by earlier I's, oldest first
  std::vector<Action> actions;
  actions.reserve(static_cast<std::size_t>(4 * microbatches));
  const auto slot = [&](int64_t stage) { return stage == chunk0 ? 0 : 1; };
  const auto next_f = [&](int64_t stage) { return forward(stage, next_forward[slot(stage)]++); };
  // A full backward (B), or an I whose W is queued.
  const auto next_b = [&](int64_t stage, bool split) {
    const int64_t microbatch = next_backward[slot(stage)]++;
    if (!split) return backward(stage, microbatch);
    pending_weights.push_back(backward_weight(stage, microbatch));
    return backward_input(stage, microbatch);
  };
  const auto add_pending_weight = [&] {
    if (pending_weights.empty()) return;
    actions.push_back(pending_weights.front());
    pending_weights.pop_front();
  };
  const auto overlap = [&](int64_t forward_stage, int64_t backward_stage) {
    const Action f = next_f(forward_stage);
    actions.push_back(overlap_forward_backward(f, next_b(backward_stage, false)));
  };

  for (int64_t i = 0; i < 2 * (pp - rank - 1); ++i) actions.push_back(next_f(chunk0));
  for (int64_t i = 0; i < rank + 1; ++i) {
    actions.push_back(next_f(chunk0));
    actions.push_back(next_f(chunk1));
  }
  for (int64_t i = 0; i < pp - rank - 1; ++i) {  // zero bubble on the way back up
    actions.push_back(next_b(chunk1, true));
    add_pending_weight();
    actions.push_back(next_f(chunk1));
  }
  for (int64_t i = 0; i < microbatches - 2 * pp + rank + 1; ++i) {  // the main phase
    if (i == 0 && rank == pp - 1) {
      // The rank at the V's tip runs its first pair apart: overlapping them would add a bubble.
      actions.push_back(next_f(chunk0));
      actions.push_back(next_b(chunk1, false));
    } else {
      overlap(chunk0, chunk1);
    }
    overlap(chunk1, chunk0);
  }
  for (int64_t i = 0; i < pp - rank - 1; ++i) {
    actions.push_back(next_b(chunk1, false));
    overlap(chunk1, chunk0);
  }
  // The second half of the cool-down splits backwards, so the W's fill the tail.
  bool split = false;
  for (int64_t i = 0; i < rank + 1; ++i) {
    if (i == (rank + 1) / 2 && rank % 2 == 1) split = true;
    actions.push_back(next_b(chunk1, split));
    if (i == (rank + 1) / 2 && rank % 2 == 0) split = true;
    actions.push_back(next_b(chunk0, split));
  }
  for (int64_t i = 0; i < pp - rank - 1; ++i) {
    add_pending_weight();
    actions.push_back(next_b(chunk0, split));
  }
  for (int64_t i = 0; i < rank + 1; ++i) add_pending_weight();
  return actions;
}

}  // namespace megaplan
