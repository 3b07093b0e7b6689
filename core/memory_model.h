// Memory per pipeline rank of a plan, by the plan's implementation. megaplan's executor: exactly the
// buffers it allocates (executor_memory.h), plus the runtime reserve. Megatron-LM's (megatron-core,
// megatron-local): weights, gradients and optimizer states by Megatron's bytes per parameter, and
// activations per layer after Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
// Transformer Models"), multiplied not by a formula per schedule but by what the plan's own
// schedule holds at its peak (schedule_facts).
//
// Megatron's accounting, by the plan's ImplementationOptions (implementation_options.h):
// - bf16/fp16 activations and weights; main gradients in fp32 (bf16 training, or fp16 with
//   --accumulate-allreduce-grads-in-fp32) or fp16; fp32 Adam states with an fp32 master copy: 18
//   bytes per parameter (16 with fp16 gradients), the 12 of the optimizer divided over dp x cp with
//   the distributed optimizer.
// - Fused attention (Transformer Engine, or --use-flash-attn): no s x s matrices are stored.
//   Unfused attention stores Korthikanti's 5as^2b (the softmax output, and with attention dropout
//   its mask and output; 2as^2b without), which selective recomputation drops.
// - Hidden dropout stores a one-byte mask after each residual branch and after the embedding.
// - Full recomputation stores each layer's input and re-materialises one layer at a time.
// - The last stage keeps the fp32 softmax of its vocabulary-parallel cross entropy per in-flight
//   microbatch and the bf16 logits transiently.
// - kRuntimeReserveBytes (CUDA context, cuBLAS workspaces, NCCL buffers) and
//   kAllocatorOverheadFraction (caching-allocator fragmentation on activations) are assumptions
//   until the profiler measures them.
#pragma once

#include <cstdint>
#include <vector>

#include "core/executor_memory.h"
#include "core/model_spec.h"
#include "core/parallel_plan.h"
#include "core/schedule/schedule.h"
#include "core/schedule/schedule_facts.h"

namespace megaplan {

inline constexpr int64_t kRuntimeReserveBytes = int64_t{1} << 30;  // 1 GiB
inline constexpr double kAllocatorOverheadFraction = 0.05;

// Bytes one transformer layer keeps for one microbatch on one GPU, from its forward until its
// backward (B, or I), and the part still needed from I until W (the weight GEMMs' inputs).
// REQUIRES: validate_plan(model, plan) passed.
StageActivationBytes transformer_layer_activation_bytes(const ModelSpec& model, const ParallelPlan& plan);

// Per virtual stage: its layers' bytes, plus the output layer's saved softmax on the last stage.
std::vector<StageActivationBytes> stage_activation_bytes(const ModelSpec& model, const ParallelPlan& plan);

struct PipelineRankMemory {
  int64_t pipeline_rank = 0;
  int64_t parameters_per_gpu = 0;
  int64_t weight_bytes = 0;
  int64_t gradient_bytes = 0;
  int64_t optimizer_bytes = 0;
  int64_t peak_inflight_microbatches = 0;  // from the schedule
  int64_t activation_bytes = 0;            // peak held by the schedule
  int64_t transient_bytes = 0;             // logits of one microbatch, or one re-materialised layer
  int64_t allocator_overhead_bytes = 0;
  int64_t runtime_reserve_bytes = 0;
  int64_t total_bytes = 0;
};

// What a GPU holds whatever the schedule: bf16 weights, fp32 gradients, the fp32 optimizer state
// (sharded over dp x cp with the distributed optimizer) and the runtime reserve. A floor under
// PipelineRankMemory::total_bytes that needs no schedule: the planner prunes with it first.
struct ModelStateBytes {
  int64_t weight_bytes = 0;
  int64_t gradient_bytes = 0;
  int64_t optimizer_bytes = 0;
  int64_t runtime_reserve_bytes = kRuntimeReserveBytes;
  int64_t total() const { return weight_bytes + gradient_bytes + optimizer_bytes + runtime_reserve_bytes; }
};
ModelStateBytes model_state_bytes(const ParallelPlan& plan, int64_t parameters_per_gpu);

// The fullest pipeline rank's model_state_bytes. REQUIRES: validate_plan(model, plan) passed.
int64_t peak_model_state_bytes(const ModelSpec& model, const ParallelPlan& plan);

// One entry per pipeline rank for `schedule` (the plan's own, see generate_plan_schedule), by
// plan.implementation.
// REQUIRES: validate_plan(model, plan) passed; schedule has the plan's shape.
std::vector<PipelineRankMemory> memory_per_pipeline_rank(const ModelSpec& model, const ParallelPlan& plan,
                                                         const PipelineSchedule& schedule);

// megaplan's entries from a walk of a plan of the same shape (executor_memory.h): what
// memory_per_pipeline_rank gives for plan.implementation megaplan, without walking again.
std::vector<PipelineRankMemory> executor_pipeline_memory(const ModelSpec& model, const ParallelPlan& plan,
                                                         const ExecutorMemoryWalk& walk);

}  // namespace megaplan
