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

// Qwen3's query and key norms on a fused qkv [tokens x groups x (group + 2) x dim], as rows of dim:
// each group's `group` query heads by q_gamma, its key head by k_gamma; its value head copied.
// rstd [tokens x groups x (group + 2)] (a value head's set to 0).
void head_rmsnorm_forward(const float* qkv, const float* q_gamma, const float* k_gamma, std::size_t tokens,
                          std::size_t groups, std::size_t group, std::size_t dim, float eps, float* y, float* rstd);
// dx (as qkv; may be dy): the norms' gradient, a value head's dy's; dq_gamma, dk_gamma [dim] +=.
void head_rmsnorm_backward(const float* dy, const float* qkv, const float* q_gamma, const float* k_gamma,
                           const float* rstd, std::size_t tokens, std::size_t groups, std::size_t group,
                           std::size_t dim, float* dx, float* dq_gamma, float* dk_gamma);

}  // namespace megaplan::exec::reference
