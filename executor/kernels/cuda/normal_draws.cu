// Normal draws of a tensor's part: each thread writes two neighbouring elements from one Philox
// draw, as the CPU backend's loop does; the double-precision Box–Muller, not memory, bounds it.
#include "executor/kernels/cuda/normal_draws.h"

#include <string>

#include "executor/kernels/cuda/device_common.cuh"

namespace megaplan::exec::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void draw_normal_kernel(float* x, uint64_t n, NormalDraws draws) {
  const uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (2 * i < n) draws.draw_two(i, n, x);
}

}  // namespace

void draw_normal(float* x, int64_t n, const NormalDraws& draws, cudaStream_t stream) {
  if (n < 0) throw SpecError("--device", "draw_normal: a negative size, " + std::to_string(n));
  if (n == 0) return;
  draw_normal_kernel<<<detail::blocks_for((n + 1) / 2, kThreads), kThreads, 0, stream>>>(x, static_cast<uint64_t>(n),
                                                                                         draws);
  detail::check_launch("draw_normal");
}

}  // namespace megaplan::exec::cuda
