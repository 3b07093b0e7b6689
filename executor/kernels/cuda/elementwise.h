// Element-wise kernels of the GPT trainer on 16-bit values (bf16 or fp16, as `precision` says): the
// residual add, GELU's and SwiGLU's gradients, rotary position embeddings, and the fp32 <-> 16-bit
// casts of weights. fp32 math inside; all pointers are device pointers; every call is asynchronous
// on the stream it is given.
#pragma once

#include <cuda_runtime_api.h>  // cudaStream_t

#include <cstdint>

#include "core/implementation_options.h"
#include "executor/kernels/cuda/bf16_linear.h"
#include "executor/kernels/rope_frequency.h"
#include "executor/kernels/token_places.h"

namespace megaplan::exec::cuda {

// y = a + b (y may alias a or b).
void add(const Half* a, const Half* b, int64_t n, Half* y, DType precision, cudaStream_t stream);
// The tanh GELU's, as reference/gelu.
void gelu_backward(const Half* dy, const Half* pre_activation, int64_t n, Half* dx, DType precision,
                   cudaStream_t stream);
// Round to nearest even (fp16 overflows to infinity); widening is exact.
void cast_to_half(const float* x, int64_t n, Half* y, DType precision, cudaStream_t stream);
void cast_to_float(const Half* x, int64_t n, float* y, DType precision, cudaStream_t stream);

// SwiGLU on x [rows x 2*width] (the gate's columns first, then the up projection's, as Megatron's
// fused fc1 output): y [rows x width] = silu(gate) * up. The backward writes dx [rows x 2*width].
void swiglu_forward(const Half* x, int64_t rows, int64_t width, Half* y, DType precision, cudaStream_t stream);
void swiglu_backward(const Half* dy, const Half* x, int64_t rows, int64_t width, Half* dx, DType precision,
                     cudaStream_t stream);

// Rotary embeddings (Megatron's default, non-interleaved "rotate half") applied IN PLACE to
// `heads` heads of each of `groups` groups of each token: element (b, t, g, h, d) at
// base[(b * seq + t) * token_stride + g * group_stride + h * head_dim + d] (a fused qkv's query
// heads and key head of each query group: heads = group + 1, group_stride = (group + 2) * head_dim);
// the first rotary_dim dims rotate, pair i (d = i and i + rotary_dim / 2) by
// the angle p * inv_freq[i] with p = places.place(t) (context parallelism; t by default), inv_freq[i] = theta^(-2i /
// rotary_dim) in fp32 as Megatron computes it, scaled where `frequencies` asks (rope_frequency.h); the rest pass
// through. The backward is the rotation by the negative angle (inverse = true). REQUIRES: rotary_dim even, 0 <
// rotary_dim <= head_dim.
void rope_apply(Half* base, int64_t batch, int64_t seq, int64_t groups, int64_t heads, int64_t head_dim,
                int64_t token_stride, int64_t group_stride, int64_t rotary_dim, const RotaryFrequencies& frequencies,
                bool inverse, DType precision, cudaStream_t stream, TokenPlaces places = {});

}  // namespace megaplan::exec::cuda
