// RoPE's inverse frequencies, one formula for the CPU reference (in double) and the CUDA kernel (in
// float): theta^(-2i / rotary_dim) for the i-th pair of rotated dimensions, then, where asked,
// Llama 3.1's scaling (transformers' rope_type "llama3", Megatron's --use-rope-scaling): a frequency
// whose wavelength 2π / f exceeds original / low_freq_factor is divided by `factor`, one whose
// wavelength is below original / high_freq_factor is kept, and those between are blended, with
// weight s = (original / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor) on
// the kept frequency and 1 - s on the divided one.
#pragma once

#include "core/model_spec.h"
#include "executor/host_device.h"

namespace megaplan::exec {

// A model's RoPE: its theta and core's RopeScaling (factor 0: none).
struct RotaryFrequencies {
  // A theta alone is unscaled RoPE.
  RotaryFrequencies(double theta_in = 10000, RopeScaling scaling_in = {})  // NOLINT(google-explicit-constructor)
      : theta(theta_in), scaling(scaling_in) {}
  double theta;
  RopeScaling scaling;
};

// `inverse_frequency` (theta^(-2i / rotary_dim)) with the scaling applied.
template <typename Real>
MEGAPLAN_HOST_DEVICE inline Real scaled_inverse_frequency(Real inverse_frequency, const RotaryFrequencies& f) {
  const RopeScaling& s = f.scaling;
  if (!(s.factor > 0)) return inverse_frequency;
  const Real factor = static_cast<Real>(s.factor);
  const Real original = static_cast<Real>(s.original_max_position_embeddings);
  const Real low = static_cast<Real>(s.low_freq_factor), high = static_cast<Real>(s.high_freq_factor);
  const Real wavelength = static_cast<Real>(6.283185307179586) / inverse_frequency;
  if (wavelength < original / high) return inverse_frequency;
  if (wavelength > original / low) return inverse_frequency / factor;
  const Real smooth = (original / wavelength - low) / (high - low);
  return (1 - smooth) * inverse_frequency / factor + smooth * inverse_frequency;
}

}  // namespace megaplan::exec
