// LayerNorm and RMSNorm over 16-bit rows (bf16 or fp16, as `precision` says) with fp32 statistics
// and fp32 math, the residual stream's add (with the branch's dropout) fused into the forward and
// its gradient into the backward. Weight gradients are fp32 and accumulate (+=), reduced in a fixed order (per-block
// partial column sums in a workspace, then one fixed-order pass over the blocks): no atomics, the
// same bits every run.
#pragma once

#include <cuda_runtime_api.h>  // cudaStream_t

#include <cstddef>
#include <cstdint>

#include "core/implementation_options.h"
#include "executor/kernels/cuda/bf16_linear.h"
#include "executor/kernels/dropout_mask.h"

namespace megaplan::exec::cuda {

// All pointers are device pointers; every call is asynchronous on the stream it is given (a
// backward's workspace stays in use until that stream has run it).
// REQUIRES: 1 <= cols <= 32768 (a row lives in registers); throws SpecError("--device", ...).

// y = LN(x') * gamma + beta with x' = x + dropout(residual) when residual is non-null: x' is then
// written to sum_out (the transformer's residual stream; fusing the branch's dropout and the add
// into the norm saves two passes), rounded to 16 bits once, and the statistics are those of the
// rounded sum, the tensor the backward sees. residual_dropout (dropout_mask.h; inactive: the
// branch as it is) places the rows as cuda::dropout does. mean and rstd [rows] fp32 are kept for
// the backward. sum_out and y may alias x.
void layernorm_forward(const Half* x, const Half* residual, const DropoutMask& residual_dropout, Half* sum_out,
                       const Half* gamma, const Half* beta, int64_t rows, int64_t cols, float eps, Half* y, float* mean,
                       float* rstd, DType precision, cudaStream_t stream);

// Scratch bytes layernorm_backward and rmsnorm_backward need for their partial column sums.
std::size_t norm_backward_workspace_bytes(int64_t rows, int64_t cols);

// x is the forward's x' (sum_out when the residual was fused). dx = dLN/dx', plus residual_grad
// when non-null (the residual stream's gradient flows around the norm); dx may alias dy or
// residual_grad. dgamma, dbeta [cols] += their sums over the rows.
void layernorm_backward(const Half* dy, const Half* x, const Half* gamma, const float* mean, const float* rstd,
                        int64_t rows, int64_t cols, const Half* residual_grad, Half* dx, float* dgamma, float* dbeta,
                        void* workspace, DType precision, cudaStream_t stream);

// RMSNorm (Llama): y = x' * rsqrt(mean(x'^2) + eps) * gamma; the same conventions as LayerNorm.
void rmsnorm_forward(const Half* x, const Half* residual, const DropoutMask& residual_dropout, Half* sum_out,
                     const Half* gamma, int64_t rows, int64_t cols, float eps, Half* y, float* rstd, DType precision,
                     cudaStream_t stream);
void rmsnorm_backward(const Half* dy, const Half* x, const Half* gamma, const float* rstd, int64_t rows, int64_t cols,
                      const Half* residual_grad, Half* dx, float* dgamma, void* workspace, DType precision,
                      cudaStream_t stream);

// Qwen3's query and key norms (--qk-layernorm) on a fused qkv of `query_groups` (tokens x groups)
// runs of group + 2 heads of `dim`: RMSNorm over each query head by q_gamma and each key head by
// k_gamma, a value head copied; rstd [query_groups x (group + 2)], a value head's 0. The backward's
// dx may alias dy (a value head's dx is its dy); dq_gamma, dk_gamma [dim] +=; its workspace is
// norm_backward_workspace_bytes(query_groups * (group + 2), dim).
void head_rmsnorm_forward(const Half* qkv, const Half* q_gamma, const Half* k_gamma, int64_t query_groups,
                          int64_t group, int64_t dim, float eps, Half* y, float* rstd, DType precision,
                          cudaStream_t stream);
void head_rmsnorm_backward(const Half* dy, const Half* qkv, const Half* q_gamma, const Half* k_gamma, const float* rstd,
                           int64_t query_groups, int64_t group, int64_t dim, Half* dx, float* dq_gamma, float* dk_gamma,
                           void* workspace, DType precision, cudaStream_t stream);

}  // namespace megaplan::exec::cuda
