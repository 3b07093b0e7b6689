// Megatron-LM's --rampup-batch-size START INCREMENT SAMPLES: the global batch starts at START and
// grows by INCREMENT in equal steps of consumed samples until SAMPLES have been consumed, then
// stays at --global-batch-size (megatron/core/num_microbatches_calculator.py's rampup calculator).
// Every batch of the ramp is a whole number of micro-batches on every data-parallel rank.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace megaplan {

struct ParallelPlan;

struct BatchRampup {
  int64_t start = 0;      // the first global batch
  int64_t increment = 0;  // added at each step of the ramp
  int64_t samples = 0;    // consumed samples over which the batch reaches the plan's
};

// Throws SpecError("--rampup-batch-size", rule) unless the ramp fits the plan: 0 < start <
// global batch, 0 < increment dividing (global batch - start), samples >= 0, and start and
// increment multiples of micro-batch size x data-parallel size (Megatron asserts each batch is).
// REQUIRES: the plan validated.
void validate_batch_rampup(const BatchRampup& rampup, const ParallelPlan& plan);

// The global batch of the iteration that starts with `consumed_samples` consumed: the plan's
// without a ramp. REQUIRES: validate_batch_rampup passed, consumed_samples >= 0.
int64_t rampup_global_batch(const std::optional<BatchRampup>& rampup, int64_t global_batch_size,
                            int64_t consumed_samples);

// The samples `iterations` iterations consume from the start, ramp included (checked arithmetic:
// SpecError naming --train-iters on overflow).
int64_t samples_of_iterations(const std::optional<BatchRampup>& rampup, int64_t global_batch_size, int64_t iterations);

// Every distinct global batch the ramp runs, increasing; {global batch} without a ramp.
std::vector<int64_t> rampup_global_batches(const std::optional<BatchRampup>& rampup, int64_t global_batch_size);

}  // namespace megaplan
