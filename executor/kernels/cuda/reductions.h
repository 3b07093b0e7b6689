// Deterministic sums over device tensors: a fixed grid, per-block partials, then one final block.
// The summation order depends only on the tensor sizes, so every run gives the same bits whatever
// the scheduling (no atomics). Accumulation is in double: the global gradient norm of ~10^8..10^9
// values keeps its precision.
#pragma once

#include <cuda_runtime_api.h>  // cudaStream_t

#include <cstdint>
#include <vector>

namespace megaplan::exec::cuda {

// n fp32 values on the device.
struct TensorSpan {
  const float* data;
  int64_t n;
};

class DeviceReducer {
 public:
  DeviceReducer();  // owns its scratch (partials, result, tensor descriptors), sized on demand
  ~DeviceReducer();
  DeviceReducer(const DeviceReducer&) = delete;
  DeviceReducer& operator=(const DeviceReducer&) = delete;

  // Sum of x[0..n), computed on `stream` after its earlier work; returns to the host (waits for
  // the stream). Throws SpecError("--device", ...).
  double sum(const float* x, int64_t n, cudaStream_t stream);
  // Sum of the squares of every value of every tensor, all tensors in one launch: the global
  // gradient norm squared. On `stream`, returned to the host as sum().
  double sum_of_squares(const std::vector<TensorSpan>& tensors, cudaStream_t stream);

 private:
  double reduce(const std::vector<TensorSpan>& tensors, bool square, cudaStream_t stream);

  void* partials_ = nullptr;     // double per block of the fixed grid
  void* result_ = nullptr;       // one double
  void* descriptors_ = nullptr;  // the last tensor list, on the device
  std::size_t descriptor_capacity_ = 0;
  std::vector<TensorSpan> uploaded_;  // what descriptors_ holds: re-uploaded only when it changes
};

}  // namespace megaplan::exec::cuda
