// What the CUDA kernels share: error checks that throw SpecError("--device", ...), 16-bit elements
// (bf16 or fp16, as a kernel's DType template argument says) <-> fp32 on the device, and
// fixed-order block reductions (no atomics: every run sums in the same order).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "core/implementation_options.h"

namespace megaplan::exec::cuda::detail {

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw SpecError("--device", std::string(what) + ": " + cudaGetErrorString(status));
}
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

inline unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// Runs body(std::integral_constant<DType, P>{}) with the call's precision as a constant: a
// launcher picks its kernel's bf16 or fp16 instantiation once, on the host.
template <typename Body>
void with_precision(DType precision, Body&& body) {
  if (precision == DType::kFloat16) return body(std::integral_constant<DType, DType::kFloat16>{});
  return body(std::integral_constant<DType, DType::kBFloat16>{});
}

// A 16-bit element's bits from fp32, rounded to nearest even (fp16 overflows to infinity), and
// back (exact). bf16 widens by a shift: it is the top half of an fp32.
template <DType P>
__device__ __forceinline__ uint16_t to_bits(float v) {
  if constexpr (P == DType::kFloat16)
    return __half_as_ushort(__float2half_rn(v));
  else
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}
template <DType P>
__device__ __forceinline__ float from_bits(uint16_t bits) {
  if constexpr (P == DType::kFloat16)
    return __half2float(__ushort_as_half(bits));
  else
    return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

template <DType P>
__device__ __forceinline__ float load(const uint16_t* p, int64_t i) {
  return from_bits<P>(p[i]);
}
template <DType P>
__device__ __forceinline__ void store(uint16_t* p, int64_t i, float v) {
  p[i] = to_bits<P>(v);
}

// Two consecutive elements as one 32-bit word, the first in the low half, rounded as to_bits (one
// paired conversion instruction).
template <DType P>
__device__ __forceinline__ uint32_t pack2(float first, float second) {
  if constexpr (P == DType::kFloat16) {
    const __half2 pair = __floats2half2_rn(first, second);
    return *reinterpret_cast<const uint32_t*>(&pair);
  } else {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(first, second);
    return *reinterpret_cast<const uint32_t*>(&pair);
  }
}

// Eight consecutive elements held as one 16-byte word, to and from floats.
template <DType P>
__device__ __forceinline__ void unpack8(uint4 raw, float (&v)[8]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    v[2 * k] = from_bits<P>(static_cast<uint16_t>(words[k] & 0xffffu));
    v[2 * k + 1] = from_bits<P>(static_cast<uint16_t>(words[k] >> 16));
  }
}
template <DType P>
__device__ __forceinline__ uint4 pack8(const float (&v)[8]) {
  return make_uint4(pack2<P>(v[0], v[1]), pack2<P>(v[2], v[3]), pack2<P>(v[4], v[5]), pack2<P>(v[6], v[7]));
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the total.
// `shared` holds 32 floats. The order is fixed by the thread layout alone.
__device__ __forceinline__ float block_sum(float v, float* shared) {
  v = warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  float total = 0;
  for (int w = 0; w < warps; ++w) total += shared[w];
  return total;
}

__device__ __forceinline__ float block_max(float v, float* shared) {
  v = warp_max(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  float total = -INFINITY;
  for (int w = 0; w < warps; ++w) total = fmaxf(total, shared[w]);
  return total;
}

// 8 16-bit values from p[start..] as floats, one 16-byte load when kAligned (p + start 16-byte
// aligned) and all 8 are in range; values at or past `end` read as 0. store8 writes 8 values
// back, rounded to nearest even, skipping those at or past `end`.
template <DType P, bool kAligned>
__device__ __forceinline__ void load8(const uint16_t* p, int64_t start, int64_t end, float (&v)[8]) {
  if (kAligned && start + 8 <= end) {
    unpack8<P>(*reinterpret_cast<const uint4*>(p + start), v);
    return;
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = start + e < end ? load<P>(p, start + e) : 0.0f;
}

template <DType P, bool kAligned>
__device__ __forceinline__ void store8(uint16_t* p, int64_t start, int64_t end, const float (&v)[8]) {
  if (kAligned && start + 8 <= end) {
    *reinterpret_cast<uint4*>(p + start) = pack8<P>(v);
    return;
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    if (start + e < end) store<P>(p, start + e, v[e]);
  }
}

// Multi-tensor kernels cut a list of tensors into fixed-size chunks: the index of the tensor that
// owns `chunk`, the last whose first_chunk <= chunk (descriptors in order of first_chunk; they are
// few and cached, so a binary search beats a per-chunk table).
template <typename Descriptor>
__device__ __forceinline__ int owner_of_chunk(const Descriptor* tensors, int count, int64_t chunk) {
  int low = 0, high = count - 1;
  while (low < high) {
    const int middle = (low + high + 1) / 2;
    if (tensors[middle].first_chunk <= chunk)
      low = middle;
    else
      high = middle - 1;
  }
  return low;
}

}  // namespace megaplan::exec::cuda::detail
