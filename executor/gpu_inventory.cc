// The parts of the GPU inventory that need no CUDA: formatting of versions and devices.
#include "executor/gpu_inventory.h"

namespace megaplan {

std::string LibraryVersion::text(bool with_patch) const {
  if (!known()) return "unknown";
  std::string result = std::to_string(major) + "." + std::to_string(minor);
  if (with_patch) result += "." + std::to_string(patch);
  return result;
}

std::string GpuDevice::sm_architecture() const {
  return "sm_" + std::to_string(compute_capability_major) + std::to_string(compute_capability_minor);
}

double GpuDevice::peak_memory_bandwidth_bytes_per_s() const {
  // Two transfers per reported memory clock, as CUDA's bandwidthTest/deviceQuery samples count
  // it: H100 SXM reports 2619 MHz on 5120 bits, 2 x 2.619e9 x 640 B = 3.35 TB/s (the datasheet).
  return 2.0 * static_cast<double>(memory_clock_khz) * 1e3 * static_cast<double>(memory_bus_width_bits) / 8.0;
}

}  // namespace megaplan
