// Hopper's warpgroup MMA (sm_90a): four warps issue one asynchronous 64 x N x 16 product whose
// B operand (and optionally A) the tensor cores read straight from shared memory, once per
// warpgroup instead of once per warp as mma.sync's ldmatrix fragments are.
//
// The inputs are bf16 or fp16, as the DType argument says: the same operands and layouts.
// Every shared tile here is [rows][cols] 16-bit values stored as cols / 64 column chunks of
// [rows][64] with the 128-byte swizzle: 16-byte piece w of row r sits at piece w ^ (r % 8).
// The same tile serves as a K-major operand (k along the columns, as Q, K and V feed QK^T) and
// as an MN-major one (k along the rows, as V feeds PV), so nothing is ever stored transposed.
#pragma once

#include <cstdint>

#include "core/implementation_options.h"

namespace megaplan::exec::cuda::detail {

#include "executor/kernels/cuda/wgmma_instructions.inc"

// Orders the warpgroup's register writes before the next wgmma reads its accumulators or A.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most Pending committed groups are still running.
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
}
// Pins accumulator registers so the compiler moves no read or write across a wait.
template <int N>
__device__ __forceinline__ void wgmma_pin(float (&d)[N]) {
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// Makes this thread's generic-proxy writes to shared memory (cp.async included) visible to the
// tensor cores' async proxy; a barrier must follow before another thread's wgmma reads them.
__device__ __forceinline__ void shared_writes_to_async_proxy() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

constexpr int kSwizzleRowBytes = 128;
constexpr int kSwizzleAtomBytes = 8 * kSwizzleRowBytes;

// Byte offset of the 16-byte piece holding columns [8 * piece, 8 * piece + 8) of row r.
template <int Rows>
__device__ __forceinline__ int swizzled_offset(int r, int piece) {
  return (piece / 8) * Rows * kSwizzleRowBytes + r * kSwizzleRowBytes + (((piece % 8) ^ (r % 8)) << 4);
}

// A shared-memory matrix descriptor with the 128-byte swizzle. `address` is the operand's
// shared-space byte address; the descriptor holds it in 16-byte units in its low 14 bits. Kernels
// keep a tile's address in a register and add constant offsets, so a descriptor costs two
// integer operations rather than a generic-to-shared conversion each.
__device__ __forceinline__ uint64_t descriptor(uint32_t address, uint32_t leading_bytes, uint32_t stride_bytes) {
  const uint32_t low = (address >> 4) | (leading_bytes >> 4) << 16;
  const uint32_t high = (stride_bytes >> 4) | 1u << 30;  // bits 62-63 = 1: the 128-byte swizzle
  return static_cast<uint64_t>(high) << 32 | low;
}

// Operand rows [row0, row0 + 64 or N), k = columns [16 * step, 16 * step + 16) of a Rows-row
// tile at shared address `tile`: eight-row groups 1024 bytes apart; a step inside a 64-column
// chunk moves the start by 32 bytes (the hardware swizzles from the address bits, so that stays
// consistent).
template <int Rows>
__device__ __forceinline__ uint64_t k_major(uint32_t tile, int row0, int step) {
  return descriptor(tile + (step / 4) * Rows * kSwizzleRowBytes + row0 * kSwizzleRowBytes + (step % 4) * 32, 16,
                    kSwizzleAtomBytes);
}

// Operand with k = rows [row0, row0 + 16) and n = all columns of a Rows-row tile (wgmma's
// transposed B): eight-row k groups 1024 bytes apart, 64-column chunks Rows * 128 bytes apart.
template <int Rows>
__device__ __forceinline__ uint64_t mn_major(uint32_t tile, int row0) {
  return descriptor(tile + row0 * kSwizzleRowBytes, Rows * kSwizzleRowBytes, kSwizzleAtomBytes);
}

}  // namespace megaplan::exec::cuda::detail
