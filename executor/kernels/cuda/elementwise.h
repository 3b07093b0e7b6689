// Element-wise bf16 kernels of the GPT trainer: the residual add, GELU's and SwiGLU's gradients,
// rotary position embeddings, and the fp32 <-> bf16 casts of weights. fp32 math inside; all
// pointers are device pointers; every call is asynchronous on the stream it is given.
#pragma once

#include <cuda_runtime_api.h>  // cudaStream_t

#include <cstdint>

#include "executor/kernels/cuda/bf16_linear.h"
#include "executor/kernels/rope_frequency.h"

namespace megaplan::exec::cuda {

void add(const Bf16* a, const Bf16* b, int64_t n, Bf16* y, cudaStream_t stream);  // y = a + b (y may alias a or b)
// The tanh GELU's, as reference/gelu.
void gelu_backward(const Bf16* dy, const Bf16* pre_activation, int64_t n, Bf16* dx, cudaStream_t stream);
void cast_to_bf16(const float* x, int64_t n, Bf16* y, cudaStream_t stream);  // round to nearest even
void cast_to_float(const Bf16* x, int64_t n, float* y, cudaStream_t stream);

// SwiGLU on x [rows x 2*width] (the gate's columns first, then the up projection's, as Megatron's
// fused fc1 output): y [rows x width] = silu(gate) * up. The backward writes dx [rows x 2*width].
void swiglu_forward(const Bf16* x, int64_t rows, int64_t width, Bf16* y, cudaStream_t stream);
void swiglu_backward(const Bf16* dy, const Bf16* x, int64_t rows, int64_t width, Bf16* dx, cudaStream_t stream);

// Rotary embeddings (Megatron's default, non-interleaved "rotate half") applied IN PLACE to
// `heads` heads of each of `groups` groups of each token: element (b, t, g, h, d) at
// base[(b * seq + t) * token_stride + g * group_stride + h * head_dim + d] (a fused qkv's query
// heads and key head of each query group: heads = group + 1, group_stride = (group + 2) * head_dim);
// the first rotary_dim dims rotate, pair i (d = i and i + rotary_dim / 2) by
// the angle t * inv_freq[i], inv_freq[i] = theta^(-2i / rotary_dim) in fp32 as Megatron computes
// it, scaled where `frequencies` asks (rope_frequency.h); the rest pass through. The backward is the rotation by the negative angle (inverse = true).
// REQUIRES: rotary_dim even, 0 < rotary_dim <= head_dim.
void rope_apply(Bf16* base, int64_t batch, int64_t seq, int64_t groups, int64_t heads, int64_t head_dim,
                int64_t token_stride, int64_t group_stride, int64_t rotary_dim, const RotaryFrequencies& frequencies,
                bool inverse, cudaStream_t stream);

}  // namespace megaplan::exec::cuda
