// SwiGLU, the CPU reference: on x [rows x 2*width] laid out as Megatron's fused fc1 output (the
// gate's `width` columns first, then the up projection's), y = silu(gate) * up [rows x width],
// with silu(g) = g * sigmoid(g). fp32 in and out, double inside.
#pragma once

#include <cstddef>

namespace megaplan::exec::reference {

void swiglu_forward(const float* x, std::size_t rows, std::size_t width, float* y);
// dx [rows x 2*width]: the gate's gradient dy * up * silu'(gate), then the up projection's dy * silu(gate).
void swiglu_backward(const float* dy, const float* x, std::size_t rows, std::size_t width, float* dx);

}  // namespace megaplan::exec::reference
