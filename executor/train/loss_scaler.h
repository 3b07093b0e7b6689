// Loss scaling for fp16 training, as Megatron-LM's grad scalers do it: the loss (and so every
// gradient) is multiplied by a scale so that small gradients survive fp16's narrow range; the
// optimizer divides it out again. An iteration whose gradients overflow (an inf or NaN anywhere)
// is skipped: no update, and the weights stay as they were.
// - Constant (--loss-scale S): the scale is S whatever happens.
// - Dynamic (--fp16 without --loss-scale): starts at --initial-loss-scale; each overflow costs one
//   unit of --hysteresis and, once it is used up, halves the scale (not below --min-loss-scale);
//   --loss-scale-window iterations in a row without overflow double it and restore the hysteresis.
#pragma once

#include <cstdint>
#include <optional>

namespace megaplan::exec {

struct LossScalerSettings {
  std::optional<double> constant;  // --loss-scale: a fixed scale (any precision, as Megatron)
  double initial = 4294967296.0;   // --initial-loss-scale (2^32, Megatron's default)
  double minimum = 1.0;            // --min-loss-scale
  int64_t window = 1000;           // --loss-scale-window
  int64_t hysteresis = 2;          // --hysteresis
  // Throws SpecError naming the flag: a non-positive or non-finite scale, a minimum above the
  // initial scale, a window or hysteresis below 1.
  void validate() const;
};

// What a checkpoint keeps of a scaler, so that a resumed run scales as an uninterrupted one.
struct LossScalerState {
  double scale = 1;
  int64_t growth_tracker = 0;      // iterations without overflow since the last change
  int64_t hysteresis_tracker = 0;  // overflows still allowed before the scale halves
};

class LossScaler {
 public:
  // REQUIRES: settings.validate() passed.
  explicit LossScaler(const LossScalerSettings& settings);
  double scale() const { return state_.scale; }
  bool dynamic() const { return !settings_.constant; }
  // After each iteration: whether its gradients overflowed.
  void update(bool overflowed);
  const LossScalerState& state() const { return state_; }
  void restore(const LossScalerState& state) { state_ = state; }

 private:
  LossScalerSettings settings_;
  LossScalerState state_;
};

}  // namespace megaplan::exec
