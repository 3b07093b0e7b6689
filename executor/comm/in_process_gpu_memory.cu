// The one-GPU InProcessMemory: device-to-device copies, the comm_reduce kernel and stream-ordered
// staging, all enqueued on the legacy default stream of device 0 (see the header for why that is
// exact).
#include "executor/comm/in_process_gpu_memory.h"

#include <cuda_runtime.h>

#include <string>

#include "core/error.h"
#include "executor/kernels/cuda/comm_reduce.h"
#include "executor/kernels/cuda/device_common.cuh"

// With per-thread default streams every rank's backend would issue on a stream of its own, and
// nothing would order a collective after the members' work.
#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
#error "the one-GPU communicator needs the legacy default stream: build without --default-stream per-thread"
#endif

namespace megaplan::exec {

namespace {

using cuda::detail::check;

// The calling thread's current device is 0, whose legacy stream every rank uses. (A rank thread's
// backend already made it so; a new thread starts there; this makes it so for any thread.)
void use_device_zero() { check(cudaSetDevice(0), "cudaSetDevice (in-process-gpu)"); }

class GpuMemory final : public InProcessMemory {
 public:
  std::string name() const override { return "gpu"; }

  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes == 0) return;
    use_device_zero();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cudaStreamLegacy),
          "cudaMemcpyAsync (in-process-gpu copy)");
  }

  void reduce(void* dst, const std::vector<const void*>& inputs, std::size_t count, DataType type,
              ReduceOp op) override {
    use_device_zero();
    cuda::comm_reduce(dst, inputs, count, type, op);
  }

  void* allocate_staging(std::size_t bytes) override {
    use_device_zero();
    void* staging = nullptr;
    check(cudaMallocAsync(&staging, bytes, cudaStreamLegacy), "cudaMallocAsync (in-process-gpu send staging)");
    return staging;
  }

  void release_staging(void* staging) noexcept override {
    // Behind the copy out on the same stream. A failure here would be a broken context, which the
    // next checked call reports.
    (void)cudaSetDevice(0);
    (void)cudaFreeAsync(staging, cudaStreamLegacy);
  }
};

}  // namespace

std::unique_ptr<InProcessMemory> make_in_process_gpu_memory() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    throw SpecError("--device", std::string("no usable CUDA GPU: ") +
                                    (status != cudaSuccess ? cudaGetErrorString(status) : "none present"));
  }
  int pools = 0;
  check(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, 0), "cudaDeviceGetAttribute");
  if (pools == 0) {
    throw SpecError("--device", "GPU 0 has no stream-ordered allocator, which the in-process one-GPU "
                                "communicator stages its messages with");
  }
  return std::make_unique<GpuMemory>();
}

}  // namespace megaplan::exec
