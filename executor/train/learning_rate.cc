#include "executor/train/learning_rate.h"

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
  if (style != DecayStyle::kConstant && decay_iterations < warmup_iterations) {
    throw SpecError("--lr-decay-iters", std::to_string(decay_iterations) + " is shorter than --lr-warmup-iters " +
                                            std::to_string(warmup_iterations));
  }
}

double LearningRateSchedule::at(int64_t iteration) const {
  if (warmup_iterations > 0 && iteration <= warmup_iterations) {
    return max_lr * static_cast<double>(iteration) / static_cast<double>(warmup_iterations);
  }
  if (style == DecayStyle::kConstant) return max_lr;
  if (iteration > decay_iterations) return min_lr;
  const double progress = static_cast<double>(iteration - warmup_iterations) /
                          static_cast<double>(std::max<int64_t>(1, decay_iterations - warmup_iterations));
  const double coefficient =
      style == DecayStyle::kLinear ? 1.0 - progress : 0.5 * (std::cos(std::numbers::pi * progress) + 1.0);
  return min_lr + coefficient * (max_lr - min_lr);
}

}  // namespace megaplan::exec
