// The GPUs and GPU libraries this process can use, and a probe that proves the build runs on a
// device. Everything CUDA stays behind this header: it includes no CUDA header, so the CLI and
// the tests build the same way whether or not the toolkit was found at configure time. In a CUDA
// build the functions below load the CUDA module on first use (cuda_module.h), built_with_cuda()
// excepted.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megaplan {

// A library version as major.minor.patch; all zero when unknown.
struct LibraryVersion {
  int major = 0;
  int minor = 0;
  int patch = 0;

  bool known() const { return major > 0 || minor > 0 || patch > 0; }
  // "13.0", or "2.28.9" with `with_patch`; "unknown" when not known.
  std::string text(bool with_patch = true) const;
};

// One CUDA device as the runtime reports it.
struct GpuDevice {
  int index = 0;                     // CUDA device ordinal (after CUDA_VISIBLE_DEVICES)
  std::string name;                  // "NVIDIA H100 80GB HBM3"
  int compute_capability_major = 0;  // 9 for sm_90
  int compute_capability_minor = 0;
  int sm_count = 0;  // streaming multiprocessors
  int64_t total_memory_bytes = 0;
  int64_t free_memory_bytes = 0;  // at query time, in this process's context
  int64_t sm_clock_khz = 0;       // peak (boost) SM clock; 0 where the runtime does not say
  int64_t memory_clock_khz = 0;   // peak memory clock; 0 where the runtime does not say
  int memory_bus_width_bits = 0;  // 0 where the runtime does not say
  std::string pci_bus_id;         // "0000:1B:00.0"

  // "sm_90"
  std::string sm_architecture() const;
  // Peak memory bandwidth from clock and bus width (double data rate), 0 when either is unknown.
  double peak_memory_bandwidth_bytes_per_s() const;
};

struct GpuInventory {
  LibraryVersion cuda_runtime;  // the libcudart this process loaded
  LibraryVersion cuda_driver;   // the newest CUDA version the installed driver supports
  LibraryVersion cublas;
  LibraryVersion cublaslt;
  LibraryVersion nccl;
  std::vector<GpuDevice> devices;
};

// Whether this build has the CUDA executor (the toolkit, cuBLAS, cuBLASLt and NCCL were found
// at configure time and MEGAPLAN_CUDA was on).
bool built_with_cuda();

// The CUDA architectures the device code was compiled for, e.g. "sm_90"; "" without CUDA.
std::string built_cuda_architectures();

// Lists every device the runtime sees with the library versions. Creates a CUDA context on each
// device (to read its free memory) and leaves the current device as it found it.
// Throws SpecError with field "gpu" when built without CUDA, when the CUDA module or a library it
// needs cannot be loaded, when no device is usable (none present, driver missing or too old), or
// when a CUDA/cuBLAS/NCCL query fails; the message names the call and the reason.
GpuInventory query_gpu_inventory();

// Proves that this build runs on device `device_index`: launches a kernel compiled into this
// binary that fills a buffer with a pattern, copies it back and compares it with the same
// pattern computed on the host, then creates and destroys a cuBLAS and a cuBLASLt handle.
// Returns normally when all of that worked; restores the current device.
// Throws SpecError with field "gpu" naming the device and the failing call otherwise: a device
// index that does not exist, a kernel image missing for this architecture, a broken cuBLAS.
void probe_device(int device_index);

}  // namespace megaplan
