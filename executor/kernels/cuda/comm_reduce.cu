// The element-wise reduction of the one-GPU communicator: one thread per element, the inputs'
// pointers in a __grid_constant__ parameter (read in place, never copied to local memory).
#include "executor/kernels/cuda/comm_reduce.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "executor/kernels/cuda/device_common.cuh"

namespace megaplan::exec::cuda {

namespace {

using detail::blocks_for;
using detail::check_launch;

constexpr int kThreads = 256;

struct Inputs {
  const void* data[kMaxCommReduceInputs];
  int count;
};

__device__ __forceinline__ float load_element(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load_element(const uint16_t* p, int64_t i) { return detail::load(p, i); }
__device__ __forceinline__ void store_element(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store_element(uint16_t* p, int64_t i, float v) { detail::store(p, i, v); }

template <typename T, bool kMax>
__global__ void comm_reduce_kernel(const __grid_constant__ Inputs inputs, int64_t n, T* dst) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float accumulator = load_element(static_cast<const T*>(inputs.data[0]), i);
  for (int r = 1; r < inputs.count; ++r) {
    const float incoming = load_element(static_cast<const T*>(inputs.data[r]), i);
    if constexpr (kMax) {
      if (isnan(incoming) || incoming > accumulator) accumulator = incoming;
    } else {
      accumulator = __fadd_rn(accumulator, incoming);  // IEEE round to nearest, as the host's +
    }
  }
  store_element(dst, i, accumulator);
}

template <typename T>
void launch(void* dst, const Inputs& inputs, int64_t n, ReduceOp op, cudaStream_t stream) {
  const unsigned blocks = blocks_for(n, kThreads);
  if (op == ReduceOp::kSum) {
    comm_reduce_kernel<T, false><<<blocks, kThreads, 0, stream>>>(inputs, n, static_cast<T*>(dst));
  } else {
    comm_reduce_kernel<T, true><<<blocks, kThreads, 0, stream>>>(inputs, n, static_cast<T*>(dst));
  }
  check_launch("comm_reduce");
}

}  // namespace

void comm_reduce(void* dst, const std::vector<const void*>& inputs, std::size_t count, DataType type, ReduceOp op,
                 cudaStream_t stream) {
  if (inputs.empty() || inputs.size() > kMaxCommReduceInputs) {
    throw std::invalid_argument("comm_reduce: " + std::to_string(inputs.size()) + " inputs (1.." +
                                std::to_string(kMaxCommReduceInputs) + " supported)");
  }
  if (count == 0) return;
  Inputs packed{};
  for (std::size_t r = 0; r < inputs.size(); ++r) packed.data[r] = inputs[r];
  packed.count = static_cast<int>(inputs.size());
  const auto n = static_cast<int64_t>(count);
  if (type == DataType::kFloat32) {
    launch<float>(dst, packed, n, op, stream);
  } else {
    launch<uint16_t>(dst, packed, n, op, stream);
  }
}

}  // namespace megaplan::exec::cuda
