// The element-wise reduction of the one-GPU communicator: one thread per element, the inputs'
// pointers in a __grid_constant__ parameter (read in place, never copied to local memory).
#include "executor/kernels/cuda/comm_reduce.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

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

// The element type of `kType` in memory, and its reads and writes as fp32.
template <DType kType>
using Element = std::conditional_t<kType == DType::kFloat32, float, uint16_t>;

template <DType kType>
__device__ __forceinline__ float load_element(const Element<kType>* p, int64_t i) {
  if constexpr (kType == DType::kFloat32)
    return p[i];
  else
    return detail::load<kType>(p, i);
}
template <DType kType>
__device__ __forceinline__ void store_element(Element<kType>* p, int64_t i, float v) {
  if constexpr (kType == DType::kFloat32)
    p[i] = v;
  else
    detail::store<kType>(p, i, v);
}

template <DType kType, bool kMax>
__global__ void comm_reduce_kernel(const __grid_constant__ Inputs inputs, int64_t n, Element<kType>* dst) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  using T = Element<kType>;
  float accumulator = load_element<kType>(static_cast<const T*>(inputs.data[0]), i);
  for (int r = 1; r < inputs.count; ++r) {
    const float incoming = load_element<kType>(static_cast<const T*>(inputs.data[r]), i);
    if constexpr (kMax) {
      if (isnan(incoming) || incoming > accumulator) accumulator = incoming;
    } else {
      accumulator = __fadd_rn(accumulator, incoming);  // IEEE round to nearest, as the host's +
    }
  }
  store_element<kType>(dst, i, accumulator);
}

template <DType kType>
void launch(void* dst, const Inputs& inputs, int64_t n, ReduceOp op, cudaStream_t stream) {
  const unsigned blocks = blocks_for(n, kThreads);
  auto* out = static_cast<Element<kType>*>(dst);
  if (op == ReduceOp::kSum) {
    comm_reduce_kernel<kType, false><<<blocks, kThreads, 0, stream>>>(inputs, n, out);
  } else {
    comm_reduce_kernel<kType, true><<<blocks, kThreads, 0, stream>>>(inputs, n, out);
  }
  check_launch("comm_reduce");
}

}  // namespace

void comm_reduce(void* dst, const std::vector<const void*>& inputs, std::size_t count, DType type, ReduceOp op,
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
  switch (type) {
    case DType::kFloat32: return launch<DType::kFloat32>(dst, packed, n, op, stream);
    case DType::kBFloat16: return launch<DType::kBFloat16>(dst, packed, n, op, stream);
    case DType::kFloat16: return launch<DType::kFloat16>(dst, packed, n, op, stream);
  }
  throw std::invalid_argument("comm_reduce: unknown DType " + std::to_string(static_cast<int>(type)));
}

}  // namespace megaplan::exec::cuda
