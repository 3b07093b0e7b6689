// One block a row: the gate's sigmoid read once, the row's elements strided over the threads, the
// backward's dot product a fixed-order block sum.
#include "executor/kernels/cuda/sigmoid_gate.h"

#include "executor/kernels/cuda/device_common.cuh"

namespace megaplan::exec::cuda {

namespace {

using namespace detail;

constexpr int kGateThreads = 256;

__device__ __forceinline__ float gate_sigmoid(float z) { return 1.0f / (1.0f + __expf(-z)); }

template <DType P>
__global__ void sigmoid_gated_add_kernel(const Half* x, const Half* gate, int64_t cols, Half* y) {
  const int64_t row = blockIdx.x;
  const float g = gate_sigmoid(load<P>(gate, row));
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const int64_t i = row * cols + c;
    store<P>(y, i, load<P>(y, i) + g * load<P>(x, i));
  }
}

template <DType P>
__global__ void sigmoid_gated_add_backward_kernel(const Half* dy, const Half* x, const Half* gate, int64_t cols,
                                                  Half* dx, float* d_gate) {
  __shared__ float partial[32];
  const int64_t row = blockIdx.x;
  const float g = gate_sigmoid(load<P>(gate, row));
  float dot = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const int64_t i = row * cols + c;
    const float d = load<P>(dy, i);
    dot += d * load<P>(x, i);
    store<P>(dx, i, g * d);
  }
  dot = block_sum(dot, partial);
  if (threadIdx.x == 0) d_gate[row] = dot * g * (1.0f - g);
}

}  // namespace

void sigmoid_gated_add(const Half* x, const Half* gate, int64_t rows, int64_t cols, Half* y, DType precision,
                       cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    sigmoid_gated_add_kernel<P><<<static_cast<unsigned>(rows), kGateThreads, 0, stream>>>(x, gate, cols, y);
  });
  check_launch("sigmoid_gated_add");
}

void sigmoid_gated_add_backward(const Half* dy, const Half* x, const Half* gate, int64_t rows, int64_t cols, Half* dx,
                                float* d_gate, DType precision, cudaStream_t stream) {
  if (rows == 0) return;
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    sigmoid_gated_add_backward_kernel<P>
        <<<static_cast<unsigned>(rows), kGateThreads, 0, stream>>>(dy, x, gate, cols, dx, d_gate);
  });
  check_launch("sigmoid_gated_add_backward");
}

}  // namespace megaplan::exec::cuda
