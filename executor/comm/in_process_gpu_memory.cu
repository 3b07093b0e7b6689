// The one-GPU InProcessMemory: device-to-device copies, the comm_reduce kernel and stream-ordered
// staging on each group's stream of device 0, ordered against the ranks' compute streams by events
// (see the header).
#include "executor/comm/in_process_gpu_memory.h"

#include <cuda_runtime.h>

#include <string>

#include "core/error.h"
#include "executor/cuda_module.h"
#include "executor/kernels/cuda/comm_reduce.h"
#include "executor/kernels/cuda/device_common.cuh"

namespace megaplan::exec {

namespace {

using cuda::detail::check;

// Every rank's buffers are on device 0. (A rank thread's backend already made it the thread's
// device; a new thread starts there; this makes it so for any thread.)
void use_device_zero() { check(cudaSetDevice(0), "cudaSetDevice (in-process-gpu)"); }

// A point: an event, destroyed when the last holder lets go (CUDA releases it once it completes).
class EventPoint final : public StreamPointImpl {
 public:
  explicit EventPoint(cudaStream_t stream) {
    check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate (in-process-gpu)");
    const cudaError_t recorded = cudaEventRecord(event_, stream);
    if (recorded != cudaSuccess) {
      (void)cudaEventDestroy(event_);
      check(recorded, "cudaEventRecord (in-process-gpu)");
    }
  }
  ~EventPoint() override { (void)cudaEventDestroy(event_); }
  EventPoint(const EventPoint&) = delete;
  EventPoint& operator=(const EventPoint&) = delete;
  cudaEvent_t event() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

StreamPoint record_on(cudaStream_t stream) {
  use_device_zero();
  return std::make_shared<const EventPoint>(stream);
}

void wait_on(cudaStream_t stream, const StreamPoint& point) {
  if (!point) return;
  use_device_zero();
  check(cudaStreamWaitEvent(stream, static_cast<const EventPoint&>(*point).event(), 0),
        "cudaStreamWaitEvent (in-process-gpu)");
}

class GpuLane final : public Lane {
 public:
  GpuLane() {
    use_device_zero();
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate (in-process-gpu lane)");
  }
  // Work still queued finishes first: CUDA destroys the stream once it is idle.
  ~GpuLane() override { (void)cudaStreamDestroy(stream_); }
  GpuLane(const GpuLane&) = delete;
  GpuLane& operator=(const GpuLane&) = delete;

  void wait(const StreamPoint& point) override { wait_on(stream_, point); }
  StreamPoint record() override { return record_on(stream_); }

  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes == 0) return;
    use_device_zero();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync (in-process-gpu copy)");
  }

  void reduce(void* dst, const std::vector<const void*>& inputs, std::size_t count, DType type, ReduceOp op) override {
    use_device_zero();
    cuda::comm_reduce(dst, inputs, count, type, op, stream_);
  }

  void* allocate_staging(std::size_t bytes) override {
    use_device_zero();
    void* staging = nullptr;
    check(cudaMallocAsync(&staging, bytes, stream_), "cudaMallocAsync (in-process-gpu send staging)");
    return staging;
  }

  void release_staging(void* staging) noexcept override {
    // Behind the copy out on the same stream. A failure here would be a broken context, which the
    // next checked call reports.
    (void)cudaSetDevice(0);
    (void)cudaFreeAsync(staging, stream_);
  }

 private:
  cudaStream_t stream_ = nullptr;
};

class GpuMemory final : public InProcessMemory {
 public:
  std::string name() const override { return "gpu"; }
  std::unique_ptr<Lane> make_lane() override { return std::make_unique<GpuLane>(); }
  StreamPoint record(void* stream) override { return record_on(static_cast<cudaStream_t>(stream)); }
  void wait(void* stream, const StreamPoint& point) override { wait_on(static_cast<cudaStream_t>(stream), point); }
};

}  // namespace
}  // namespace megaplan::exec

namespace megaplan::cuda_module {

std::unique_ptr<exec::InProcessMemory> make_in_process_gpu_memory() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    throw SpecError("--device", std::string("no usable CUDA GPU: ") +
                                    (status != cudaSuccess ? cudaGetErrorString(status) : "none present"));
  }
  int pools = 0;
  exec::check(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, 0), "cudaDeviceGetAttribute");
  if (pools == 0) {
    throw SpecError("--device",
                    "GPU 0 has no stream-ordered allocator, which the in-process one-GPU "
                    "communicator stages its messages with");
  }
  return std::make_unique<exec::GpuMemory>();
}

}  // namespace megaplan::cuda_module
