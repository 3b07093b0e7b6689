// Element-wise kernels: each thread handles 8 consecutive values, as one 16-byte access of 16-bit
// values (two for fp32) when every pointer is 16-byte aligned, else as scalar accesses (also for
// the tail). Each kernel is instantiated for bf16 and fp16 (P) and picked once per call.
#include "executor/kernels/cuda/elementwise.h"

#include <cmath>
#include <string>

#include "executor/kernels/cuda/device_common.cuh"

namespace megaplan::exec::cuda {

namespace {

using namespace detail;

constexpr int kThreads = 256;

// --- 8-value vectors: fp32 overloads here, the 16-bit ones in device_common.cuh.
using detail::load8;
using detail::store8;

template <bool kAligned>
__device__ __forceinline__ void load8(const float* p, int64_t start, int64_t end, float (&v)[8]) {
  if (kAligned && start + 8 <= end) {
    const float4 low = *reinterpret_cast<const float4*>(p + start);
    const float4 high = *reinterpret_cast<const float4*>(p + start + 4);
    v[0] = low.x, v[1] = low.y, v[2] = low.z, v[3] = low.w;
    v[4] = high.x, v[5] = high.y, v[6] = high.z, v[7] = high.w;
    return;
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = start + e < end ? p[start + e] : 0.0f;
}

template <bool kAligned>
__device__ __forceinline__ void store8(float* p, int64_t start, int64_t end, const float (&v)[8]) {
  if (kAligned && start + 8 <= end) {
    *reinterpret_cast<float4*>(p + start) = make_float4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<float4*>(p + start + 4) = make_float4(v[4], v[5], v[6], v[7]);
    return;
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    if (start + e < end) p[start + e] = v[e];
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

__device__ __forceinline__ int64_t vector_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

template <DType P, bool kAligned>
__global__ void add_kernel(const Half* a, const Half* b, int64_t n, Half* y) {
  const int64_t start = vector_index() * 8;
  if (start >= n) return;
  float va[8], vb[8];
  load8<P, kAligned>(a, start, n, va);
  load8<P, kAligned>(b, start, n, vb);
#pragma unroll
  for (int e = 0; e < 8; ++e) va[e] += vb[e];
  store8<P, kAligned>(y, start, n, va);
}

template <DType P, bool kAligned>
__global__ void gelu_backward_kernel(const Half* dy, const Half* pre, int64_t n, Half* dx) {
  const int64_t start = vector_index() * 8;
  if (start >= n) return;
  constexpr float kScale = 0.7978845608028654f;  // sqrt(2 / pi)
  constexpr float kCubic = 0.044715f;
  float g[8], v[8];
  load8<P, kAligned>(dy, start, n, g);
  load8<P, kAligned>(pre, start, n, v);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float x = v[e];
    const float t = tanhf(kScale * (x + kCubic * x * x * x));
    const float derivative = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kScale * (1.0f + 3.0f * kCubic * x * x);
    g[e] *= derivative;
  }
  store8<P, kAligned>(dx, start, n, g);
}

template <DType P, bool kAligned>
__global__ void cast_to_half_kernel(const float* x, int64_t n, Half* y) {
  const int64_t start = vector_index() * 8;
  if (start >= n) return;
  float v[8];
  load8<kAligned>(x, start, n, v);
  store8<P, kAligned>(y, start, n, v);
}

template <DType P, bool kAligned>
__global__ void cast_to_float_kernel(const Half* x, int64_t n, float* y) {
  const int64_t start = vector_index() * 8;
  if (start >= n) return;
  float v[8];
  load8<P, kAligned>(x, start, n, v);
  store8<kAligned>(y, start, n, v);
}

__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + __expf(-v)); }

// One thread per 8 columns of one row; vectors_per_row = ceil(width / 8).
template <DType P, bool kAligned>
__global__ void swiglu_forward_kernel(const Half* x, int64_t rows, int64_t width, int64_t vectors_per_row, Half* y) {
  const int64_t i = vector_index();
  if (i >= rows * vectors_per_row) return;
  const int64_t row = i / vectors_per_row, start = (i % vectors_per_row) * 8;
  const Half* gate_row = x + row * 2 * width;
  float gate[8], up[8];
  load8<P, kAligned>(gate_row, start, width, gate);
  load8<P, kAligned>(gate_row + width, start, width, up);
#pragma unroll
  for (int e = 0; e < 8; ++e) gate[e] = gate[e] * sigmoid(gate[e]) * up[e];
  store8<P, kAligned>(y + row * width, start, width, gate);
}

template <DType P, bool kAligned>
__global__ void swiglu_backward_kernel(const Half* dy, const Half* x, int64_t rows, int64_t width,
                                       int64_t vectors_per_row, Half* dx) {
  const int64_t i = vector_index();
  if (i >= rows * vectors_per_row) return;
  const int64_t row = i / vectors_per_row, start = (i % vectors_per_row) * 8;
  const Half* gate_row = x + row * 2 * width;
  float gate[8], up[8], grad[8];
  load8<P, kAligned>(gate_row, start, width, gate);
  load8<P, kAligned>(gate_row + width, start, width, up);
  load8<P, kAligned>(dy + row * width, start, width, grad);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float s = sigmoid(gate[e]);
    const float d_up = grad[e] * gate[e] * s;
    gate[e] = grad[e] * up[e] * s * (1.0f + gate[e] * (1.0f - s));  // silu'(g) = s (1 + g (1 - s))
    up[e] = d_up;
  }
  Half* dx_row = dx + row * 2 * width;
  store8<P, kAligned>(dx_row, start, width, gate);
  store8<P, kAligned>(dx_row + width, start, width, up);
}

// One thread per token and 8 consecutive rotation pairs: the 8 angles' sines and cosines are
// computed once and applied to every head of the token.
template <DType P, bool kAligned>
__global__ void rope_kernel(Half* base, int64_t tokens, int64_t seq, int64_t groups, int64_t heads, int64_t head_dim,
                            int64_t token_stride, int64_t group_stride, int64_t half, int64_t vectors_per_token,
                            float log2_theta, float rotary_dim, RotaryFrequencies frequencies, bool inverse,
                            TokenPlaces places) {
  const int64_t i = vector_index();
  if (i >= tokens * vectors_per_token) return;
  const int64_t token = i / vectors_per_token, start = (i % vectors_per_token) * 8;
  const float position = static_cast<float>(places.place(token % seq));
  float cosine[8], sine[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    // Megatron's inv_freq = 1 / theta^(2i / rotary_dim) and angle = t * inv_freq, both fp32.
    // Llama 3.1's scaling on top where asked (rope_frequency.h).
    const float inv_freq = scaled_inverse_frequency(
        1.0f / exp2f(log2_theta * (2.0f * static_cast<float>(start + e) / rotary_dim)), frequencies);
    sincosf(position * inv_freq, &sine[e], &cosine[e]);
    if (inverse) sine[e] = -sine[e];
  }
  for (int64_t g = 0; g < groups; ++g) {
    Half* head = base + token * token_stride + g * group_stride;
    for (int64_t h = 0; h < heads; ++h, head += head_dim) {
      float x1[8], x2[8], out1[8], out2[8];
      load8<P, kAligned>(head, start, half, x1);
      load8<P, kAligned>(head + half, start, half, x2);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        out1[e] = x1[e] * cosine[e] - x2[e] * sine[e];
        out2[e] = x2[e] * cosine[e] + x1[e] * sine[e];
      }
      store8<P, kAligned>(head, start, half, out1);
      store8<P, kAligned>(head + half, start, half, out2);
    }
  }
}

unsigned grid_for_vectors(int64_t vectors) { return blocks_for(vectors, kThreads); }

void check_count(int64_t n, const char* what) {
  if (n < 0) throw SpecError("--device", std::string(what) + ": a negative size, " + std::to_string(n));
}

}  // namespace

void add(const Half* a, const Half* b, int64_t n, Half* y, DType precision, cudaStream_t stream) {
  check_count(n, "add");
  if (n == 0) return;
  const unsigned grid = grid_for_vectors((n + 7) / 8);
  const bool aligned = aligned16(a) && aligned16(b) && aligned16(y);
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    const auto kernel = aligned ? add_kernel<P, true> : add_kernel<P, false>;
    kernel<<<grid, kThreads, 0, stream>>>(a, b, n, y);
  });
  check_launch("add");
}

void gelu_backward(const Half* dy, const Half* pre_activation, int64_t n, Half* dx, DType precision,
                   cudaStream_t stream) {
  check_count(n, "gelu_backward");
  if (n == 0) return;
  const unsigned grid = grid_for_vectors((n + 7) / 8);
  const bool aligned = aligned16(dy) && aligned16(pre_activation) && aligned16(dx);
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    const auto kernel = aligned ? gelu_backward_kernel<P, true> : gelu_backward_kernel<P, false>;
    kernel<<<grid, kThreads, 0, stream>>>(dy, pre_activation, n, dx);
  });
  check_launch("gelu_backward");
}

void cast_to_half(const float* x, int64_t n, Half* y, DType precision, cudaStream_t stream) {
  check_count(n, "cast_to_half");
  if (n == 0) return;
  const unsigned grid = grid_for_vectors((n + 7) / 8);
  const bool aligned = aligned16(x) && aligned16(y);
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    const auto kernel = aligned ? cast_to_half_kernel<P, true> : cast_to_half_kernel<P, false>;
    kernel<<<grid, kThreads, 0, stream>>>(x, n, y);
  });
  check_launch("cast_to_half");
}

void cast_to_float(const Half* x, int64_t n, float* y, DType precision, cudaStream_t stream) {
  check_count(n, "cast_to_float");
  if (n == 0) return;
  const unsigned grid = grid_for_vectors((n + 7) / 8);
  const bool aligned = aligned16(x) && aligned16(y);
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    const auto kernel = aligned ? cast_to_float_kernel<P, true> : cast_to_float_kernel<P, false>;
    kernel<<<grid, kThreads, 0, stream>>>(x, n, y);
  });
  check_launch("cast_to_float");
}

void swiglu_forward(const Half* x, int64_t rows, int64_t width, Half* y, DType precision, cudaStream_t stream) {
  check_count(rows, "swiglu_forward");
  check_count(width, "swiglu_forward");
  if (rows == 0 || width == 0) return;
  const int64_t vectors_per_row = (width + 7) / 8;
  const unsigned grid = grid_for_vectors(rows * vectors_per_row);
  const bool aligned = width % 8 == 0 && aligned16(x) && aligned16(y);
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    const auto kernel = aligned ? swiglu_forward_kernel<P, true> : swiglu_forward_kernel<P, false>;
    kernel<<<grid, kThreads, 0, stream>>>(x, rows, width, vectors_per_row, y);
  });
  check_launch("swiglu_forward");
}

void swiglu_backward(const Half* dy, const Half* x, int64_t rows, int64_t width, Half* dx, DType precision,
                     cudaStream_t stream) {
  check_count(rows, "swiglu_backward");
  check_count(width, "swiglu_backward");
  if (rows == 0 || width == 0) return;
  const int64_t vectors_per_row = (width + 7) / 8;
  const unsigned grid = grid_for_vectors(rows * vectors_per_row);
  const bool aligned = width % 8 == 0 && aligned16(dy) && aligned16(x) && aligned16(dx);
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    const auto kernel = aligned ? swiglu_backward_kernel<P, true> : swiglu_backward_kernel<P, false>;
    kernel<<<grid, kThreads, 0, stream>>>(dy, x, rows, width, vectors_per_row, dx);
  });
  check_launch("swiglu_backward");
}

void rope_apply(Half* base, int64_t batch, int64_t seq, int64_t groups, int64_t heads, int64_t head_dim,
                int64_t token_stride, int64_t group_stride, int64_t rotary_dim, const RotaryFrequencies& frequencies,
                bool inverse, DType precision, cudaStream_t stream, TokenPlaces places) {
  const double theta = frequencies.theta;
  if (rotary_dim <= 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim || batch < 0 || seq < 0 || heads < 0 ||
      groups < 1 || group_stride < heads * head_dim || token_stride < (groups - 1) * group_stride + heads * head_dim ||
      !(theta > 1.0)) {
    throw SpecError("--device",
                    "rope_apply: needs an even 0 < rotary_dim <= head_dim, group_stride >= heads * "
                    "head_dim, token_stride past the last group's heads and theta > 1; got rotary_dim " +
                        std::to_string(rotary_dim) + ", head_dim " + std::to_string(head_dim) + ", group_stride " +
                        std::to_string(group_stride) + ", token_stride " + std::to_string(token_stride) + ", theta " +
                        std::to_string(theta));
  }
  const int64_t tokens = batch * seq;
  if (tokens == 0 || heads == 0) return;
  const int64_t half = rotary_dim / 2;
  const int64_t vectors_per_token = (half + 7) / 8;
  const unsigned grid = grid_for_vectors(tokens * vectors_per_token);
  const auto log2_theta = static_cast<float>(std::log2(theta));
  const bool aligned =
      half % 8 == 0 && head_dim % 8 == 0 && token_stride % 8 == 0 && group_stride % 8 == 0 && aligned16(base);
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    const auto kernel = aligned ? rope_kernel<P, true> : rope_kernel<P, false>;
    kernel<<<grid, kThreads, 0, stream>>>(base, tokens, seq, groups, heads, head_dim, token_stride, group_stride, half,
                                          vectors_per_token, log2_theta, static_cast<float>(rotary_dim), frequencies,
                                          inverse, places);
  });
  check_launch("rope_apply");
}

}  // namespace megaplan::exec::cuda
