// The learning rate at each iteration, as Megatron-LM's OptimizerParamScheduler computes it:
// linear warm-up from 0 to --lr over --lr-warmup-iters, then --lr-decay-style down to --min-lr at
// --lr-decay-iters (linear, or cosine: min + (max - min) * (1 + cos(pi * progress)) / 2), and
// --min-lr after that; "constant" keeps --lr after the warm-up.
#pragma once

#include <cstdint>
#include <string>

namespace megaplan::exec {

enum class DecayStyle { kConstant, kLinear, kCosine };
// "constant", "linear", "cosine"; throws SpecError("--lr-decay-style", ...) otherwise.
DecayStyle parse_decay_style(const std::string& text);

struct LearningRateSchedule {
  double max_lr = 1e-4;            // --lr
  double min_lr = 0;               // --min-lr
  int64_t warmup_iterations = 0;   // --lr-warmup-iters
  int64_t decay_iterations = 0;    // --lr-decay-iters (0: --train-iters, set by the caller)
  DecayStyle style = DecayStyle::kLinear;

  // Throws SpecError naming the flag: negative rates, min above max, warm-up longer than decay.
  void validate() const;
  // The rate for the update that ends iteration `iteration` (1-based, as Megatron counts steps).
  double at(int64_t iteration) const;
};

}  // namespace megaplan::exec
