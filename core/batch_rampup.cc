#include "core/batch_rampup.h"

#include <algorithm>
#include <string>

#include "core/checked_math.h"
#include "core/error.h"
#include "core/parallel_plan.h"

namespace megaplan {

namespace {

constexpr const char* kFlag = "--rampup-batch-size";

}  // namespace

void validate_batch_rampup(const BatchRampup& rampup, const ParallelPlan& plan) {
  const int64_t gbs = plan.global_batch_size;
  if (rampup.start <= 0 || rampup.start >= gbs) {
    throw SpecError(kFlag, "the start batch must be positive and below --global-batch-size " + std::to_string(gbs) +
                               ", got " + std::to_string(rampup.start));
  }
  if (rampup.increment <= 0) {
    throw SpecError(kFlag, "the increment must be positive, got " + std::to_string(rampup.increment));
  }
  if (rampup.samples < 0)
    throw SpecError(kFlag, "the ramp's samples must be non-negative, got " + std::to_string(rampup.samples));
  require_divides(rampup.increment, gbs - rampup.start, kFlag, [&] {
    return "the increment " + std::to_string(rampup.increment) + " must divide --global-batch-size minus the start, " +
           std::to_string(gbs - rampup.start);
  });
  const int64_t step = plan.micro_batch_size * plan.data_parallel_size;
  for (const int64_t size : {rampup.start, rampup.increment}) {
    require_divides(step, size, kFlag, [&] {
      return "every batch of the ramp must be a multiple of micro-batch size x data-parallel size " +
             std::to_string(step) + ", and " + std::to_string(size) + " is not";
    });
  }
}

int64_t rampup_global_batch(const std::optional<BatchRampup>& rampup, int64_t global_batch_size,
                            int64_t consumed_samples) {
  if (!rampup || consumed_samples > rampup->samples) return global_batch_size;
  // Megatron's arithmetic: samples per increment as a real number, the step count its floor.
  const int64_t increments = (global_batch_size - rampup->start) / rampup->increment;
  const double samples_per_increment = static_cast<double>(rampup->samples) / static_cast<double>(increments);
  const auto steps = static_cast<int64_t>(static_cast<double>(consumed_samples) / samples_per_increment);
  const int64_t batch = rampup->start + std::min(steps, increments) * rampup->increment;
  return std::min(batch, global_batch_size);
}

int64_t samples_of_iterations(const std::optional<BatchRampup>& rampup, int64_t global_batch_size, int64_t iterations) {
  int64_t consumed = 0;
  int64_t done = 0;
  // The ramp, one iteration at a time (at most samples / start of them), then the constant batch.
  for (; done < iterations && rampup && consumed <= rampup->samples; ++done) {
    consumed += rampup_global_batch(rampup, global_batch_size, consumed);
  }
  return checked_add(consumed, checked_multiply(iterations - done, global_batch_size, "--train-iters"),
                     "--train-iters");
}

std::vector<int64_t> rampup_global_batches(const std::optional<BatchRampup>& rampup, int64_t global_batch_size) {
  if (!rampup) return {global_batch_size};
  std::vector<int64_t> batches;
  for (int64_t batch = rampup->start; batch <= global_batch_size; batch += rampup->increment) batches.push_back(batch);
  return batches;
}

}  // namespace megaplan
