// GELU with the tanh approximation (GPT-2's and Megatron's "gelu" with bias fusion):
// gelu(x) = x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3))). The CPU reference.
#pragma once

#include <cstddef>

namespace megaplan::exec::reference {

void gelu_forward(const float* x, std::size_t n, float* y);
// dx = dy * gelu'(x).
void gelu_backward(const float* dy, const float* x, std::size_t n, float* dx);

}  // namespace megaplan::exec::reference
