#include "executor/train/learning_rate.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace megaplan::exec {

DecayStyle parse_decay_style(const std::string& text) {
  if (text == "constant") return DecayStyle::kConstant;
  if (text == "linear") return DecayStyle::kLinear;
  if (text == "cosine") return DecayStyle::kCosine;
  throw SpecError("--lr-decay-style", "unknown style \"" + text + "\" (known: constant, linear, cosine)");
}

void LearningRateSchedule::validate() const {
  if (!(max_lr >= 0) || !std::isfinite(max_lr)) throw SpecError("--lr", "must be a finite non-negative number");
  if (!(min_lr >= 0) || min_lr > max_lr) throw SpecError("--min-lr", "must lie in [0, --lr]");
  if (warmup_iterations < 0) throw SpecError("--lr-warmup-iters", "must be non-negative");
  if (warmup_samples < 0) throw SpecError("--lr-warmup-samples", "must be non-negative");
  if (decay_iterations < 0) throw SpecError("--lr-decay-iters", "must be non-negative");
  if (decay_samples < 0) throw SpecError("--lr-decay-samples", "must be non-negative");
  if ((warmup_samples > 0 || decay_samples > 0) && (warmup_iterations > 0 || decay_iterations > 0)) {
    throw SpecError(
        warmup_samples > 0 ? "--lr-warmup-samples" : "--lr-decay-samples",
        "is sample-based and cannot be combined with --lr-warmup-iters or --lr-decay-iters (Megatron's rule)");
  }
  if (warmup_fraction) {
    if (!(*warmup_fraction >= 0 && *warmup_fraction <= 1))
      throw SpecError("--lr-warmup-fraction", "must lie in [0, 1]");
    if (warmup_iterations > 0 || warmup_samples > 0) {
      throw SpecError("--lr-warmup-fraction",
                      "cannot be combined with --lr-warmup-iters or --lr-warmup-samples (Megatron's rule)");
    }
  }
  if (style != DecayStyle::kConstant && !warmup_fraction) {
    if (decay_iterations < warmup_iterations) {
      throw SpecError("--lr-decay-iters", std::to_string(decay_iterations) + " is shorter than --lr-warmup-iters " +
                                              std::to_string(warmup_iterations));
    }
    if (decay_samples > 0 && decay_samples < warmup_samples) {
      throw SpecError("--lr-decay-samples", std::to_string(decay_samples) + " is shorter than --lr-warmup-samples " +
                                                std::to_string(warmup_samples));
    }
  }
}

double LearningRateSchedule::at(int64_t consumed_samples, int64_t global_batch_size) const {
  const double batch = static_cast<double>(global_batch_size);
  const double decay =
      decay_samples > 0 ? static_cast<double>(decay_samples) : static_cast<double>(decay_iterations) * batch;
  const double warmup = warmup_fraction      ? *warmup_fraction * decay
                        : warmup_samples > 0 ? static_cast<double>(warmup_samples)
                                             : static_cast<double>(warmup_iterations) * batch;
  const double step = static_cast<double>(consumed_samples);
  if (warmup > 0 && step <= warmup) return max_lr * step / warmup;
  if (style == DecayStyle::kConstant) return max_lr;
  if (step > decay) return min_lr;
  const double progress = (step - warmup) / std::max(1.0, decay - warmup);
  const double coefficient =
      style == DecayStyle::kLinear ? 1.0 - progress : 0.5 * (std::cos(std::numbers::pi * progress) + 1.0);
  return min_lr + coefficient * (max_lr - min_lr);
}

}  // namespace megaplan::exec
