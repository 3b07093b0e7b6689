// The initial weights' normal draws on the GPU (executor/kernels/normal_draws.h): the values the
// CPU backend draws, bit for bit, for this rank's part of a tensor only.
#pragma once

#include <cuda_runtime_api.h>  // cudaStream_t

#include <cstdint>

#include "executor/kernels/normal_draws.h"

namespace megaplan::exec::cuda {

// x[i] = draws' element i of the rank's part, i < n, fp32 (draws.draw_two, one thread per two
// elements). Asynchronous on `stream`.
void draw_normal(float* x, int64_t n, const NormalDraws& draws, cudaStream_t stream);

}  // namespace megaplan::exec::cuda
