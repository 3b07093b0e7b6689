// LayerNorm and RMSNorm over bf16 rows with fp32 statistics and fp32 math, the residual stream's
// add fused into the forward and its gradient into the backward. Weight gradients are fp32 and
// accumulate (+=), reduced in a fixed order (per-block partial column sums in a workspace, then
// one fixed-order pass over the blocks): no atomics, the same bits every run.
#pragma once

#include <cuda_runtime_api.h>  // cudaStream_t

#include <cstddef>
#include <cstdint>

#include "executor/kernels/cuda/bf16_linear.h"

namespace megaplan::exec::cuda {

// All pointers are device pointers; every call is asynchronous on the stream it is given (a
// backward's workspace stays in use until that stream has run it).
// REQUIRES: 1 <= cols <= 32768 (a row lives in registers); throws SpecError("--device", ...).

// y = LN(x') * gamma + beta with x' = x + residual when residual is non-null: x' is then written
// to sum_out (the transformer's residual stream; fusing the add into the norm saves a pass),
// rounded to bf16, and the statistics are those of the rounded sum, the tensor the backward sees.
// mean and rstd [rows] fp32 are kept for the backward. sum_out and y may alias x.
void layernorm_forward(const Bf16* x, const Bf16* residual, Bf16* sum_out, const Bf16* gamma, const Bf16* beta,
                       int64_t rows, int64_t cols, float eps, Bf16* y, float* mean, float* rstd, cudaStream_t stream);

// Scratch bytes layernorm_backward and rmsnorm_backward need for their partial column sums.
std::size_t norm_backward_workspace_bytes(int64_t rows, int64_t cols);

// x is the forward's x' (sum_out when the residual was fused). dx = dLN/dx', plus residual_grad
// when non-null (the residual stream's gradient flows around the norm); dx may alias dy or
// residual_grad. dgamma, dbeta [cols] += their sums over the rows.
void layernorm_backward(const Bf16* dy, const Bf16* x, const Bf16* gamma, const float* mean, const float* rstd,
                        int64_t rows, int64_t cols, const Bf16* residual_grad, Bf16* dx, float* dgamma, float* dbeta,
                        void* workspace, cudaStream_t stream);

// RMSNorm (Llama): y = x' * rsqrt(mean(x'^2) + eps) * gamma; the same conventions as LayerNorm.
void rmsnorm_forward(const Bf16* x, const Bf16* residual, Bf16* sum_out, const Bf16* gamma, int64_t rows, int64_t cols,
                     float eps, Bf16* y, float* rstd, cudaStream_t stream);
void rmsnorm_backward(const Bf16* dy, const Bf16* x, const Bf16* gamma, const float* rstd, int64_t rows, int64_t cols,
                      const Bf16* residual_grad, Bf16* dx, float* dgamma, void* workspace, cudaStream_t stream);

}  // namespace megaplan::exec::cuda
