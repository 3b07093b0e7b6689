#include "executor/kernels/cuda/reductions.h"

#include <algorithm>
#include <string>

#include "executor/kernels/cuda/device_common.cuh"

namespace megaplan::exec::cuda {

namespace {

using namespace detail;

constexpr int kThreads = 256;
constexpr int kVectorsPerThread = 4;
constexpr int64_t kChunk = kThreads * kVectorsPerThread * 4;  // values one block reads per chunk
// A constant, not the device's multiprocessor count: the order of the sum, and so its bits, must
// not depend on the GPU it runs on.
constexpr int kMaxBlocks = 1024;

struct Descriptor {
  const float* data;
  int64_t n;
  int64_t first_chunk;
  int vectorized;
};

__device__ __forceinline__ double warp_sum_double(double v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Every thread gets the block's total; the order is fixed by the thread layout alone.
__device__ __forceinline__ double block_sum_double(double v) {
  __shared__ double warp_totals[kThreads / 32];
  v = warp_sum_double(v);
  if (threadIdx.x % 32 == 0) warp_totals[threadIdx.x / 32] = v;
  __syncthreads();
  double total = 0;
  for (int w = 0; w < kThreads / 32; ++w) total += warp_totals[w];
  return total;
}

template <bool kSquare>
__device__ __forceinline__ double term(float x) {
  const double value = x;
  return kSquare ? value * value : value;
}

// Block b sums chunks b, b + gridDim.x, ...; within a chunk each thread takes the same 16 values
// in the same order whether or not the tensor allows float4 loads, so alignment never changes bits.
template <bool kSquare>
__global__ void __launch_bounds__(kThreads)
    partial_sums_kernel(const Descriptor* tensors, int count, int64_t chunks, double* partials) {
  double sum = 0;
  for (int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    const Descriptor d = tensors[owner_of_chunk(tensors, count, chunk)];
    const int64_t start = (chunk - d.first_chunk) * kChunk;
    const int64_t end = min(start + kChunk, d.n);
    float4 values[kVectorsPerThread];
#pragma unroll
    for (int u = 0; u < kVectorsPerThread; ++u) {
      const int64_t i = start + (u * kThreads + threadIdx.x) * 4;
      if (d.vectorized && i + 4 <= end) {
        values[u] = *reinterpret_cast<const float4*>(d.data + i);
      } else {
        values[u] = make_float4(i < end ? d.data[i] : 0.0f, i + 1 < end ? d.data[i + 1] : 0.0f,
                                i + 2 < end ? d.data[i + 2] : 0.0f, i + 3 < end ? d.data[i + 3] : 0.0f);
      }
    }
#pragma unroll
    for (int u = 0; u < kVectorsPerThread; ++u) {
      sum += term<kSquare>(values[u].x);
      sum += term<kSquare>(values[u].y);
      sum += term<kSquare>(values[u].z);
      sum += term<kSquare>(values[u].w);
    }
  }
  const double total = block_sum_double(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void __launch_bounds__(kThreads) final_sum_kernel(const double* partials, int count, double* result) {
  double sum = 0;
  for (int i = threadIdx.x; i < count; i += kThreads) sum += partials[i];
  const double total = block_sum_double(sum);
  if (threadIdx.x == 0) *result = total;
}

bool same_list(const std::vector<TensorSpan>& a, const std::vector<TensorSpan>& b) {
  const auto same = [](const TensorSpan& x, const TensorSpan& y) { return x.data == y.data && x.n == y.n; };
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), same);
}

}  // namespace

DeviceReducer::DeviceReducer() {
  check(cudaMalloc(&partials_, kMaxBlocks * sizeof(double)), "cudaMalloc (reduction partials)");
  check(cudaMalloc(&result_, sizeof(double)), "cudaMalloc (reduction result)");
}

DeviceReducer::~DeviceReducer() {
  if (descriptors_) cudaFree(descriptors_);
  if (result_) cudaFree(result_);
  if (partials_) cudaFree(partials_);
}

double DeviceReducer::sum(const float* x, int64_t n, cudaStream_t stream) {
  return reduce({TensorSpan{x, n}}, false, stream);
}

double DeviceReducer::sum_of_squares(const std::vector<TensorSpan>& tensors, cudaStream_t stream) {
  return reduce(tensors, true, stream);
}

// Every call ends waiting for `stream`, so no earlier call's kernels still read the descriptors or
// the partials when this one overwrites them, whichever stream it ran on.
double DeviceReducer::reduce(const std::vector<TensorSpan>& tensors, bool square, cudaStream_t stream) {
  std::vector<Descriptor> descriptors;
  int64_t chunks = 0;
  for (const TensorSpan& t : tensors) {
    if (t.n < 0 || (t.n > 0 && !t.data)) {
      throw SpecError("--device", "DeviceReducer: a tensor of n = " + std::to_string(t.n) + " is invalid");
    }
    if (t.n == 0) continue;  // no chunk: keeps first_chunk strictly increasing for the search
    descriptors.push_back({t.data, t.n, chunks, reinterpret_cast<uintptr_t>(t.data) % 16 == 0 ? 1 : 0});
    chunks += (t.n + kChunk - 1) / kChunk;
  }
  if (descriptors.empty()) return 0.0;
  if (!same_list(tensors, uploaded_)) {
    const std::size_t bytes = descriptors.size() * sizeof(Descriptor);
    if (bytes > descriptor_capacity_) {
      if (descriptors_) cudaFree(descriptors_);
      descriptors_ = nullptr;
      descriptor_capacity_ = 0;
      check(cudaMalloc(&descriptors_, bytes), "cudaMalloc (reduction descriptors)");
      descriptor_capacity_ = bytes;
    }
    uploaded_.clear();  // stays empty if the copy throws
    // From pageable memory the copy returns once the bytes are staged: `descriptors` may go.
    check(cudaMemcpyAsync(descriptors_, descriptors.data(), bytes, cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync (descriptors)");
    uploaded_ = tensors;
  }
  const int blocks = static_cast<int>(std::min<int64_t>(chunks, kMaxBlocks));
  const auto* device_descriptors = static_cast<const Descriptor*>(descriptors_);
  const int count = static_cast<int>(descriptors.size());
  auto* partials = static_cast<double*>(partials_);
  if (square) {
    partial_sums_kernel<true><<<blocks, kThreads, 0, stream>>>(device_descriptors, count, chunks, partials);
  } else {
    partial_sums_kernel<false><<<blocks, kThreads, 0, stream>>>(device_descriptors, count, chunks, partials);
  }
  check_launch("partial_sums_kernel");
  final_sum_kernel<<<1, kThreads, 0, stream>>>(partials, blocks, static_cast<double*>(result_));
  check_launch("final_sum_kernel");
  double result = 0;
  check(cudaMemcpyAsync(&result, result_, sizeof result, cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync (reduction result)");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (reduction result)");
  return result;
}

}  // namespace megaplan::exec::cuda
