// Which of core's preset GPUs a CUDA device is, for the tools that measure one (`megaplan
// profile`) and the MFU the trainer reports.
#pragma once

#include <optional>
#include <string>

#include "core/cluster_spec.h"

namespace megaplan {

// The preset GPU a CUDA device is, by the name the runtime gives it ("NVIDIA H100 80GB HBM3" is
// the H100 SXM5, "NVIDIA H200" the H200 SXM, "NVIDIA A100-SXM4-80GB"); nullopt for any other (a
// PCIe or NVL part differs in clocks, power and memory, so it is not taken for the SXM one).
// Implemented beside the presets (cluster_presets.cc).
std::optional<GpuSpec> gpu_preset_for_device(const std::string& device_name);

}  // namespace megaplan
