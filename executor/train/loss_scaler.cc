#include "executor/train/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace megaplan::exec {

namespace {

// Megatron's growth and backoff factors (not flags there either).
constexpr double kGrowthFactor = 2.0;
constexpr double kBackoffFactor = 0.5;

void require_positive(double value, const char* flag) {
  if (!(value > 0) || !std::isfinite(value)) throw SpecError(flag, "must be a finite positive number");
}

}  // namespace

void LossScalerSettings::validate() const {
  if (constant) require_positive(*constant, "--loss-scale");
  require_positive(initial, "--initial-loss-scale");
  require_positive(minimum, "--min-loss-scale");
  if (minimum > initial) throw SpecError("--min-loss-scale", "must not exceed --initial-loss-scale");
  if (window < 1) throw SpecError("--loss-scale-window", "must be a positive integer");
  if (hysteresis < 1) throw SpecError("--hysteresis", "must be a positive integer");
}

LossScaler::LossScaler(const LossScalerSettings& settings) : settings_(settings) {
  state_.scale = settings.constant ? *settings.constant : settings.initial;
  state_.hysteresis_tracker = settings.hysteresis;
}

void LossScaler::update(bool overflowed) {
  if (!dynamic()) return;
  if (overflowed) {
    state_.growth_tracker = 0;
    if (--state_.hysteresis_tracker <= 0) state_.scale = std::max(state_.scale * kBackoffFactor, settings_.minimum);
    return;
  }
  if (++state_.growth_tracker == settings_.window) {
    state_.growth_tracker = 0;
    state_.hysteresis_tracker = settings_.hysteresis;
    state_.scale *= kGrowthFactor;
  }
}

}  // namespace megaplan::exec
