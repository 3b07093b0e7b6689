// LayerNorm over the last dimension, the CPU reference (and the CPU backend's kernel):
// y = (x - mean) / sqrt(var + eps) * gamma + beta, per row of `cols` values, fp32 with double sums.
#pragma once

#include <cstddef>

namespace megaplan::exec::reference {

// Writes y[rows x cols] and, for the backward, each row's mean and reciprocal standard deviation.
void layernorm_forward(const float* x, const float* gamma, const float* beta, std::size_t rows, std::size_t cols,
                       float eps, float* y, float* mean, float* rstd);

// dx[rows x cols]; dgamma and dbeta[cols] are accumulated into (+=), as gradients accumulate
// over microbatches.
void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean, const float* rstd,
                        std::size_t rows, std::size_t cols, float* dx, float* dgamma, float* dbeta);

}  // namespace megaplan::exec::reference
