// Dropout of a token-major tensor, with the residual add fused or not: each thread takes 8
// consecutive values of one row, as one 16-byte access when the rows and pointers allow it, and
// draws their keep bits from the two (or, where a row's elements do not start a Philox block,
// three) draws that cover them.
#include "executor/kernels/cuda/dropout.h"

#include <string>

#include "executor/kernels/cuda/device_common.cuh"
#include "executor/kernels/cuda/elementwise.h"

namespace megaplan::exec::cuda {

namespace {

using namespace detail;

constexpr int kThreads = 256;

template <DType P, bool kAligned>
__global__ void dropout_kernel(const Half* x, const Half* residual, int64_t rows, int64_t cols, int64_t vectors_per_row,
                               DropoutMask mask, Half* y) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * vectors_per_row) return;
  const int64_t row = i / vectors_per_row, start = (i % vectors_per_row) * 8;
  float v[8];
  load8<P, kAligned>(x + row * cols, start, cols, v);
  drop_token_values(mask, row, cols, start, static_cast<int>(cols - start < 8 ? cols - start : 8), v);
  if (residual) {
    float r[8];
    load8<P, kAligned>(residual + row * cols, start, cols, r);
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] += r[e];
  }
  store8<P, kAligned>(y + row * cols, start, cols, v);
}

}  // namespace

void require_drawable(const DropoutMask& mask, const std::string& what) {
  if (mask.active() && (!(mask.probability < 1.0f) || mask.seq <= 0)) {
    throw SpecError("--device", what + ": needs 0 <= p < 1 and a positive seq, got p " +
                                    std::to_string(mask.probability) + ", seq " + std::to_string(mask.seq));
  }
}

void dropout(const Half* x, const Half* residual, int64_t rows, int64_t cols, const DropoutMask& mask, Half* y,
             DType precision, cudaStream_t stream) {
  if (rows < 0 || cols < 0) {
    throw SpecError("--device", "dropout: a negative size, " + std::to_string(rows) + " x " + std::to_string(cols));
  }
  if (rows == 0 || cols == 0) return;
  if (!mask.active()) {
    if (residual) {
      add(x, residual, rows * cols, y, precision, stream);
    } else if (x != y) {
      check(cudaMemcpyAsync(y, x, static_cast<size_t>(rows * cols) * sizeof(Half), cudaMemcpyDeviceToDevice, stream),
            "dropout copy");
    }
    return;
  }
  require_drawable(mask, "dropout");
  const int64_t vectors_per_row = (cols + 7) / 8;
  const unsigned grid = blocks_for(rows * vectors_per_row, kThreads);
  const bool aligned = cols % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(residual) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    const auto kernel = aligned ? dropout_kernel<P, true> : dropout_kernel<P, false>;
    kernel<<<grid, kThreads, 0, stream>>>(x, residual, rows, cols, vectors_per_row, mask, y);
  });
  check_launch("dropout");
}

}  // namespace megaplan::exec::cuda
