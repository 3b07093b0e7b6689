// Megatron's dropout on the GPU with the counter-based masks of dropout_mask.h, so that every
// element is kept or dropped exactly as the CPU reference decides; and the keep bits of a run of
// consecutive mask elements, which the flash attention kernels draw for their probabilities.
#pragma once

#include <cuda_runtime_api.h>  // cudaStream_t

#include <cstdint>
#include <string>

#include "core/implementation_options.h"
#include "executor/host_device.h"
#include "executor/kernels/cuda/bf16_linear.h"
#include "executor/kernels/dropout_mask.h"

namespace megaplan::exec::cuda {

// y[r][c] = x[r][c] * mask.scale() where mask.keeps_token(r, c, cols), else 0, plus
// residual[r][c] where residual is non-null (Megatron's dropout-add, fused), in fp32 and rounded
// once to the 16-bit type, over this rank's token-major rows x cols; an inactive mask copies (or
// adds). Asynchronous on `stream`.
// REQUIRES: y is x or residual (in place), or overlaps neither.
void dropout(const Half* x, const Half* residual, int64_t rows, int64_t cols, const DropoutMask& mask, Half* y,
             DType precision, cudaStream_t stream);

// Whether elements first, first + 1, ..., first + count - 1 (count <= 64) of global sample
// `sample`'s tensor are kept: bit i for element first + i. The run touches the Philox blocks
// (first / 4) + j, j < blocks; this draws only j = first_block, first_block + block_step, ... and
// leaves the other blocks' bits 0, so threads that share a run split its blocks and OR their
// results, every draw serving four elements.
MEGAPLAN_HOST_DEVICE inline uint64_t dropout_keep_bits(const DropoutMask& mask, int64_t sample, uint64_t first,
                                                       int count, int first_block, int block_step) {
  const int offset = static_cast<int>(first & 3);
  const int blocks = (offset + count + 3) / 4;
  uint64_t bits = 0;
  for (int j = first_block; j < blocks; j += block_step) {
    // The four keeps share one counter, so the compiler draws once for them.
    const uint64_t block = (first >> 2) + static_cast<uint64_t>(j);
    uint64_t word = 0;
    for (uint64_t w = 0; w < 4; ++w) word |= static_cast<uint64_t>(mask.keeps(sample, block << 2 | w)) << w;
    const int shift = 4 * j - offset;  // at most count - 1
    bits |= shift >= 0 ? word << shift : word >> -shift;
  }
  return count < 64 ? bits & ((uint64_t{1} << count) - 1) : bits;
}

// Throws SpecError("--device", ...) naming `what` unless an active mask is one the kernels can
// draw: p < 1 and a positive seq.
void require_drawable(const DropoutMask& mask, const std::string& what);

#ifdef __CUDACC__
// The mask on v, `count` (<= 8) consecutive values of this rank's token-major row `row` from
// column `start` of `cols` (keeps_token's arithmetic once for them): kept values scaled by
// __fmul_rn, never contracted into an FMA with an add that follows (a fused dropout-add rounds
// as residual + round(v * scale), as the CPU reference does), the rest 0.
__device__ __forceinline__ void drop_token_values(const DropoutMask& mask, int64_t row, int64_t cols, int64_t start,
                                                  int count, float (&v)[8]) {
  const DropoutMask::TokenElement at = mask.token_element(row, start, cols);
  const uint64_t kept = dropout_keep_bits(mask, at.sample, at.element, count, 0, 1);
  const float scale = mask.scale();
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = (kept >> e) & 1 ? __fmul_rn(v[e], scale) : 0.0f;
}
#endif

}  // namespace megaplan::exec::cuda
