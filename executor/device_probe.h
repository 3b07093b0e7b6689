// Internal to executor/: the probe kernel's launcher and the pattern it writes, shared by the
// device code and the host check so that both sides compute it from one definition.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>  // cudaError_t, cudaStream_t

#include "executor/host_device.h"

namespace megaplan::detail {

// Element `i` of the probe pattern: a 32-bit mix of the index and the seed (the murmur3
// finalizer), so that a kernel which did not run, ran twice or wrote the wrong slot is caught.
MEGAPLAN_HOST_DEVICE constexpr uint32_t probe_pattern(uint64_t i, uint32_t seed) {
  uint32_t x = static_cast<uint32_t>(i) * 0x9E3779B1u + seed;
  x ^= x >> 16;
  x *= 0x85EBCA6Bu;
  x ^= x >> 13;
  x *= 0xC2B2AE35u;
  x ^= x >> 16;
  return x;
}

// Fills out[0, n) with probe_pattern(i, seed) on `stream`. Returns the launch status
// (cudaGetLastError right after the launch): cudaErrorNoKernelImageForDevice shows up here.
// REQUIRES: `out` is device memory of at least n elements on the current device.
cudaError_t launch_fill_probe_pattern(uint32_t* out, size_t n, uint32_t seed, cudaStream_t stream);

// The architectures nvcc compiled device code for, as __CUDA_ARCH_LIST__ spells them: "900" or
// "800,900" (10 x compute capability).
const char* device_code_architecture_list();

}  // namespace megaplan::detail
