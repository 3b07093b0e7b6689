// What the CUDA kernels share: error checks that throw SpecError("--device", ...), bf16 <-> fp32
// on the device, and fixed-order block reductions (no atomics: every run sums in the same order).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/error.h"

namespace megaplan::exec::cuda::detail {

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw SpecError("--device", std::string(what) + ": " + cudaGetErrorString(status));
}
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

inline unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

__device__ __forceinline__ float load(const uint16_t* p, int64_t i) {
  return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p)[i]);
}
__device__ __forceinline__ void store(uint16_t* p, int64_t i, float v) {
  reinterpret_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
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

// 8 bf16 values from p[start..] as floats, one 16-byte load when kAligned (p + start 16-byte
// aligned) and all 8 are in range; values at or past `end` read as 0. store8 writes 8 values
// back, rounded to nearest even, skipping those at or past `end`.
template <bool kAligned>
__device__ __forceinline__ void load8(const uint16_t* p, int64_t start, int64_t end, float (&v)[8]) {
  if (kAligned && start + 8 <= end) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p + start);
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // bf16 is the top half of an fp32
      v[2 * k] = __uint_as_float(words[k] << 16);
      v[2 * k + 1] = __uint_as_float(words[k] & 0xffff0000u);
    }
    return;
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = start + e < end ? load(p, start + e) : 0.0f;
}

template <bool kAligned>
__device__ __forceinline__ void store8(uint16_t* p, int64_t start, int64_t end, const float (&v)[8]) {
  uint16_t bits[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) bits[e] = __bfloat16_as_ushort(__float2bfloat16_rn(v[e]));
  if (kAligned && start + 8 <= end) {
    uint4 raw;
    raw.x = bits[0] | (uint32_t{bits[1]} << 16);
    raw.y = bits[2] | (uint32_t{bits[3]} << 16);
    raw.z = bits[4] | (uint32_t{bits[5]} << 16);
    raw.w = bits[6] | (uint32_t{bits[7]} << 16);
    *reinterpret_cast<uint4*>(p + start) = raw;
    return;
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    if (start + e < end) p[start + e] = bits[e];
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
    if (tensors[middle].first_chunk <= chunk) low = middle; else high = middle - 1;
  }
  return low;
}

}  // namespace megaplan::exec::cuda::detail
