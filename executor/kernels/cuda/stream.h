// An owned CUDA stream for the launchers' `stream` argument: the backend's compute stream, and a
// test's or benchmark's. Non-blocking: it neither waits for the legacy default stream nor holds that
// stream up, so its work is ordered by its own queue and by the events its users record, never by
// an implicit synchronisation with work issued elsewhere that a forgotten argument would hide.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "core/error.h"

namespace megaplan::exec::cuda {

class Stream {
 public:
  // On the current device. Throws SpecError("--device", ...) when CUDA cannot create it.
  Stream() {
    const cudaError_t status = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    if (status != cudaSuccess) {
      throw SpecError("--device", std::string("cudaStreamCreateWithFlags: ") + cudaGetErrorString(status));
    }
  }
  // Returns at once: work still queued runs to its end, and CUDA releases the stream after it.
  ~Stream() { (void)cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // A handle, passed where a cudaStream_t is expected (launchers, copies, events).
  operator cudaStream_t() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace megaplan::exec::cuda
