// Cluster presets. Every GPU, NVLink and NIC number is from the vendor datasheet cited in the
// preset's `source`; datasheets quote NVLink as a bidirectional sum, stored here per direction.
// Link latencies are not on datasheets: they are assumptions until profiles measure them.
#include <nlohmann/json.hpp>

#include "core/cluster_spec.h"
#include "core/device_gpu.h"
#include "core/error.h"

namespace megaplan {

namespace {

constexpr double kTera = 1e12;
constexpr double kGiga = 1e9;
constexpr int64_t kGigabyte = 1'000'000'000;
// DGX presets scale out to this many nodes on a non-blocking fat tree; --gpus picks how many.
constexpr int64_t kSuperPodNodes = 4096;
constexpr double kAssumedNvlinkLatencyS = 1e-6;
constexpr double kAssumedInfinibandLatencyS = 2e-6;
const std::string kLatencyNote = " Link latencies are assumptions (not on datasheets) until measured.";

GpuSpec a100_sxm4_80gb() {
  // NVIDIA A100 Tensor Core GPU datasheet: BF16/FP16 312 TFLOPS dense, 80GB HBM2e, 2,039 GB/s;
  // 108 SMs (NVIDIA A100 Tensor Core GPU Architecture whitepaper).
  return {"A100-SXM4-80GB", 312 * kTera, 312 * kTera, 80 * kGigabyte, 2039 * kGiga, 108};
}

GpuSpec h100_sxm5_80gb() {
  // NVIDIA H100 Tensor Core GPU datasheet (SXM): BF16/FP16 1,979 TFLOPS with sparsity, i.e.
  // 989.4 dense; 80GB HBM3, 3.35 TB/s; 132 SMs (NVIDIA H100 Tensor Core GPU Architecture whitepaper).
  return {"H100-SXM5-80GB", 989.4 * kTera, 989.4 * kTera, 80 * kGigabyte, 3350 * kGiga, 132};
}

GpuSpec h200_sxm_141gb() {
  // NVIDIA H200 Tensor Core GPU datasheet (SXM): BF16/FP16 1,979 TFLOPS with sparsity, i.e.
  // 989.4 dense; 141GB HBM3e, 4.8 TB/s; the H100's GH100 with its 132 SMs.
  return {"H200-SXM-141GB", 989.4 * kTera, 989.4 * kTera, 141 * kGigabyte, 4800 * kGiga, 132};
}

IntraNodeFabric nvswitch(double bidirectional_bytes_per_s) {
  return {"NVSwitch", bidirectional_bytes_per_s / 2, kAssumedNvlinkLatencyS};
}

InterNodeNetwork infiniband(const std::string& kind, double gigabits_per_s) {
  return {kind, 8, gigabits_per_s * kGiga / 8, kAssumedInfinibandLatencyS};
}

std::vector<ClusterSpec> build_cluster_presets() {
  const InterNodeNetwork no_network{"none", 0, 0, 0};
  return {
      {"dgx-a100-80gb", kSuperPodNodes, 8, a100_sxm4_80gb(), nvswitch(600 * kGiga), infiniband("InfiniBand HDR", 200),
       "NVIDIA DGX A100 datasheet: 8x A100-SXM4-80GB, NVSwitch 600 GB/s bidirectional per GPU, "
       "8x ConnectX-6 HDR 200 Gb/s for compute; A100 datasheet." +
           kLatencyNote},
      {"dgx-h100", kSuperPodNodes, 8, h100_sxm5_80gb(), nvswitch(900 * kGiga), infiniband("InfiniBand NDR", 400),
       "NVIDIA DGX H100 datasheet: 8x H100-SXM5-80GB, NVLink 900 GB/s bidirectional per GPU, "
       "8x ConnectX-7 NDR 400 Gb/s for compute; H100 datasheet." +
           kLatencyNote},
      {"dgx-h200", kSuperPodNodes, 8, h200_sxm_141gb(), nvswitch(900 * kGiga), infiniband("InfiniBand NDR", 400),
       "NVIDIA DGX H200 datasheet: 8x H200-SXM-141GB, NVLink 900 GB/s bidirectional per GPU, "
       "8x ConnectX-7 NDR 400 Gb/s for compute; H200 datasheet." +
           kLatencyNote},
      {"h100-x1", 1, 1, h100_sxm5_80gb(), {"none", 0, 0}, no_network, "One H100-SXM5-80GB (H100 datasheet)."},
      {"h200-x1", 1, 1, h200_sxm_141gb(), {"none", 0, 0}, no_network, "One H200-SXM-141GB (H200 datasheet)."},
      {"h200-x2", 1, 2, h200_sxm_141gb(), nvswitch(900 * kGiga), no_network,
       "Two H200-SXM-141GB on one HGX board, NVLink 900 GB/s bidirectional per GPU (H200 datasheet)." + kLatencyNote},
  };
}

}  // namespace

const std::vector<ClusterSpec>& cluster_presets() {
  static const std::vector<ClusterSpec> presets = build_cluster_presets();
  return presets;
}

std::optional<GpuSpec> gpu_preset_for_device(const std::string& device_name) {
  const auto has = [&](const char* text) { return device_name.find(text) != std::string::npos; };
  if (has("PCIe") || has("NVL")) return std::nullopt;
  if (has("H100") && has("80GB HBM3")) return h100_sxm5_80gb();
  if (has("H200")) return h200_sxm_141gb();
  if (has("A100-SXM4-80GB")) return a100_sxm4_80gb();
  return std::nullopt;
}

ClusterSpec cluster_preset(const std::string& name) {
  std::string known;
  for (const ClusterSpec& preset : cluster_presets()) {
    if (preset.name == name) return preset;
    known += (known.empty() ? "" : ", ") + preset.name;
  }
  throw SpecError("--cluster", "unknown preset \"" + name + "\"; known presets: " + known + " (or a .json file)");
}

}  // namespace megaplan
