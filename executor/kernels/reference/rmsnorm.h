// RMSNorm over the last dimension (Llama's norm), the CPU reference:
// y = x / sqrt(mean(x^2) + eps) * gamma, per row of `cols` values, fp32 with double sums.
#pragma once

#include <cstddef>

namespace megaplan::exec::reference {

// Writes y[rows x cols] and, for the backward, each row's reciprocal root mean square.
void rmsnorm_forward(const float* x, const float* gamma, std::size_t rows, std::size_t cols, float eps, float* y,
                     float* rstd);

// dx[rows x cols]; dgamma[cols] is accumulated into (+=), as gradients accumulate over microbatches.
void rmsnorm_backward(const float* dy, const float* x, const float* gamma, const float* rstd, std::size_t rows,
                      std::size_t cols, float* dx, float* dgamma);

}  // namespace megaplan::exec::reference
