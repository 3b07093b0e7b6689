// The bytes megaplan's executor allocates on each pipeline rank, buffer by buffer as
// executor/model/stage_chunk.cc, executor/runtime/interpreter.cc and executor/train/optimizer.cc
// allocate them, walked through the rank's lowered schedule: one home for the executor's refusal of
// a plan that does not fit and for the simulator's memory of megaplan's own implementation
// (memory_model.h is Megatron-LM's accounting). tests/executor/model/executor_memory_test.cc holds it
// equal to what the CPU backend's ranks allocate, schedule by schedule.
//
// What the executor holds:
// - per stage chunk: fp32 master weights and fp32 gradients in Megatron DDP's padded buffer
//   (parameter_layout.h), a compute copy of every weight (bf16 on the GPU; the CPU backend computes
//   on the fp32 masters), AdamW's two fp32 moments (over the buffer, or the rank's shard of each
//   bucket with the distributed optimizer), and one set of scratch buffers (with
//   --moe-router-enable-expert-bias, each MoE layer's expert bias and its counts among them);
// - per microbatch in flight on a chunk (from its F until B or W): what each layer keeps
//   (recomputation decides), the chunk's output, and on the last stage the final norm's input, the
//   logits and the loss's statistics. Released sets are kept for reuse, so a chunk holds as many as
//   it ever had in flight at once;
// - a pool of whole-layer sets lent to recomputation (and to the forward of layers that keep less
//   than everything), as large as the most ever lent at once; under I the lent sets, I's copies of
//   each GEMM's output gradient and the first stage's embedding gradient stay until W;
// - messages (pooled the same way, one size): a received input from its RECV_F until its F copies
//   it into the set; a gradient from RECV_B, or from the backward that produces it, until the
//   backward that consumes it, or until OPTIM for those sent.
// Transient host-value staging (a few words per logged value) is not counted.
//
// Llama-family layers are counted with their own widths (query groups, SwiGLU's [gate; up]) in the
// GPT layer's buffer pattern, as core/kernel_list.h lists their kernels.
#pragma once

#include <cstdint>
#include <vector>

#include "core/layer_recipe.h"
#include "core/model_spec.h"
#include "core/parallel_plan.h"
#include "core/schedule/schedule.h"

namespace megaplan {

// What a backend stores per element.
struct ExecutorRankMemory {
  int64_t pipeline_rank = 0;
  int64_t master_weight_bytes = 0;   // fp32, the DDP buffer's padding included
  int64_t gradient_bytes = 0;        // fp32, the same layout
  int64_t compute_weight_bytes = 0;  // the weights the layers read (0 when compute is fp32)
  int64_t optimizer_bytes = 0;       // AdamW's moments
  int64_t scratch_bytes = 0;         // one set per chunk
  // At the rank's peak: microbatch sets, the recomputation pool, I's deferred gradients and the
  // gradient messages; with the most microbatches a chunk had in flight at once, summed over chunks.
  int64_t activation_bytes = 0;
  int64_t peak_inflight_microbatches = 0;
  int64_t total_bytes = 0;  // all of the above: what the rank's backend allocates at most
};

// A walk without bytes: per pipeline rank, its stages and the counts (per chunk: microbatch sets
// and lent layer sets ever held at once, microbatches awaiting W; then gradient messages ever held
// at once) at every moment one grows. Its events depend on the schedule and the recomputation
// only, so the planner keeps one per (schedule, pp, vpp, microbatches, recomputation) and prices
// it for each plan of that shape.
struct ExecutorMemoryWalk {
  struct Rank {
    std::vector<int64_t> stages;
    std::vector<std::vector<int64_t>> moments;
    int64_t most_inflight = 0;
  };
  std::vector<Rank> ranks;
};

// REQUIRES as executor_memory_per_pipeline_rank.
ExecutorMemoryWalk walk_executor_memory(const ModelSpec& model, const ParallelPlan& plan,
                                        const PipelineSchedule& schedule, bool evaluates = false);

// A floor under walk_executor_memory's walk of any plan of `schedule`'s shape, priced alike: each
// chunk's microbatch sets held at most at once and I's gradients awaiting W, which follow the
// compute order alone (lowering adds messages and reductions around it), and nothing lent or in
// messages. Pricing is a sum of counts times bytes, so the floor prices at most what the walk does.
// The planner refuses plans over the limit on the floor without lowering their schedules;
// `schedule` may be compute-only.
ExecutorMemoryWalk executor_memory_floor(const PipelineSchedule& schedule);

// REQUIRES: `walk` was taken for a plan of the same schedule, pp, vpp, microbatches, layers and
// recomputation as `plan`.
std::vector<ExecutorRankMemory> price_executor_memory(const ExecutorMemoryWalk& walk, const ModelSpec& model,
                                                      const ParallelPlan& plan, const ExecutorPrecision& precision,
                                                      int64_t bucket_size = 0);

// One entry per pipeline rank. `schedule` is the plan's schedule, lowered or not: the walk lowers a
// compute-only one first, since what the executor holds depends on where its receives are posted.
// `bucket_size`: --ddp-bucket-size (0: Megatron's default); with `evaluates`, evaluation's two
// message buffers after the iteration.
// REQUIRES: validate_plan(model, plan) passed; schedule has the plan's shape.
std::vector<ExecutorRankMemory> executor_memory_per_pipeline_rank(const ModelSpec& model, const ParallelPlan& plan,
                                                                  const PipelineSchedule& schedule,
                                                                  const ExecutorPrecision& precision,
                                                                  int64_t bucket_size = 0, bool evaluates = false);

}  // namespace megaplan
