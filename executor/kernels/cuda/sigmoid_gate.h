// The shared expert's gate of an MoE layer (--moe-shared-expert-gate, Qwen2-MoE's
// shared_expert_gate) on 16-bit rows (bf16 or fp16, as `precision` says), fp32 math inside, as
// Backend::sigmoid_gated_add defines it. All pointers are device pointers; every call is
// asynchronous on the stream it is given.
#pragma once

#include <cuda_runtime_api.h>  // cudaStream_t

#include <cstdint>

#include "core/implementation_options.h"
#include "executor/kernels/cuda/bf16_linear.h"

namespace megaplan::exec::cuda {

// y [rows x cols] += sigmoid(gate[r]) * x[r].
void sigmoid_gated_add(const Half* x, const Half* gate, int64_t rows, int64_t cols, Half* y, DType precision,
                       cudaStream_t stream);
// dx = sigmoid(gate) * dy (dx may be dy); d_gate [rows] (fp32) = sigmoid'(gate) * sum over the row
// of dy * x, summed in a fixed order.
void sigmoid_gated_add_backward(const Half* dy, const Half* x, const Half* gate, int64_t rows, int64_t cols, Half* dx,
                                float* d_gate, DType precision, cudaStream_t stream);

}  // namespace megaplan::exec::cuda
