// The probe kernel: the smallest piece of device code that proves this binary holds a kernel
// image the GPU can run (see probe_device in gpu_inventory.h).
#include "executor/device_probe.h"

#include <cuda_runtime.h>

namespace megaplan::detail {
namespace {

__global__ void fill_probe_pattern(uint32_t* out, size_t n, uint32_t seed) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = probe_pattern(i, seed);
  }
}

}  // namespace

cudaError_t launch_fill_probe_pattern(uint32_t* out, size_t n, uint32_t seed, cudaStream_t stream) {
  if (out == nullptr || n == 0) return cudaErrorInvalidValue;
  constexpr unsigned kThreads = 256;
  const size_t blocks_needed = (n + kThreads - 1) / kThreads;
  const unsigned blocks = blocks_needed < 1024 ? static_cast<unsigned>(blocks_needed) : 1024u;
  fill_probe_pattern<<<blocks, kThreads, 0, stream>>>(out, n, seed);
  return cudaGetLastError();
}

#define MEGAPLAN_STRINGIFY_(x) #x
#define MEGAPLAN_STRINGIFY(x) MEGAPLAN_STRINGIFY_(x)

const char* device_code_architecture_list() {
#ifdef __CUDA_ARCH_LIST__
  return MEGAPLAN_STRINGIFY(__CUDA_ARCH_LIST__);
#else
  return "";
#endif
}

}  // namespace megaplan::detail
