// What each action of a plan does on one GPU, in the units a timeline's reader wants beside its
// duration: FLOPs for compute (F, B, I, W: every GEMM and attention kernel of the executor's kernel
// list for that part of the stage, recomputation included), bytes for communication (a pipeline
// message, a stage's gradients reduced over dp x cp). The simulator costs transfers of these sizes,
// so the sizes have one home here.
#pragma once

#include <cstdint>
#include <vector>

#include "core/model_spec.h"
#include "core/parallel_plan.h"
#include "core/schedule/action.h"

namespace megaplan {

// One pipeline message (an activation, or its gradient) as each tensor-parallel rank sends it:
// the microbatch's bf16 hidden states, divided over tp with sequence parallelism or Megatron's
// scatter-gather transfers. REQUIRES: validate_plan(model, plan) passed.
int64_t pipeline_message_bytes(const ModelSpec& model, const ParallelPlan& plan);

// One microbatch on one virtual stage, per GPU.
struct StageWork {
  double forward_flops = 0;
  double backward_flops = 0;         // B, with recomputation
  double backward_input_flops = 0;   // I, with recomputation
  double backward_weight_flops = 0;  // W
  int64_t message_bytes = 0;         // each SEND/RECV to or from a neighbouring stage
  int64_t gradient_bytes = 0;        // REDUCE_GRAD: the stage's main gradients (0 when dp x cp is 1)
};

// One entry per virtual stage. REQUIRES: validate_plan(model, plan) passed.
std::vector<StageWork> stage_work(const ModelSpec& model, const ParallelPlan& plan);

struct ActionWork {
  double flops = 0;   // F, B, I, W, OVERLAP_F_B
  int64_t bytes = 0;  // SEND_*, RECV_*, REDUCE_GRAD
};

// The work of `action` by its stage's entry; OPTIM (memory-bound, per rank) counts neither.
// REQUIRES: action.stage indexes `stages` unless the action is OPTIM.
ActionWork action_work(const std::vector<StageWork>& stages, const Action& action);

}  // namespace megaplan
