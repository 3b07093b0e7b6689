// The learning rate at each iteration, as Megatron-LM's OptimizerParamScheduler computes it, in
// consumed samples: linear warm-up from 0 to --lr, then --lr-decay-style down to --min-lr at the end
// of the decay (linear, or cosine: min + (max - min) * (1 + cos(pi * progress)) / 2), and --min-lr
// after that; "constant" keeps --lr after the warm-up. Megatron's two forms of the flags: iteration-
// based (--lr-warmup-iters, --lr-decay-iters: times the global batch) or sample-based
// (--lr-warmup-samples, --lr-decay-samples); --lr-warmup-fraction is a share of the decay in either.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace megaplan::exec {

enum class DecayStyle { kConstant, kLinear, kCosine };
// "constant", "linear", "cosine"; throws SpecError("--lr-decay-style", ...) otherwise.
DecayStyle parse_decay_style(const std::string& text);

struct LearningRateSchedule {
  double max_lr = 1e-4;                   // --lr
  double min_lr = 0;                      // --min-lr
  int64_t warmup_iterations = 0;          // --lr-warmup-iters
  int64_t decay_iterations = 0;           // --lr-decay-iters (0: --train-iters, set by the caller)
  int64_t warmup_samples = 0;             // --lr-warmup-samples
  int64_t decay_samples = 0;              // --lr-decay-samples (0: --train-samples, set by the caller)
  std::optional<double> warmup_fraction;  // --lr-warmup-fraction: of the decay; excludes the two above
  DecayStyle style = DecayStyle::kLinear;

  // Throws SpecError naming the flag: negative rates, min above max, a fraction outside [0, 1],
  // a fraction beside a warm-up length, both forms given, warm-up longer than decay.
  void validate() const;
  // The rate at `consumed_samples` samples into the schedule: the update that follows them runs at
  // it (Megatron's scheduler steps after each update); the iteration-based flags count
  // `global_batch_size` samples an iteration, as Megatron's scheduler does.
  double at(int64_t consumed_samples, int64_t global_batch_size) const;
};

}  // namespace megaplan::exec
