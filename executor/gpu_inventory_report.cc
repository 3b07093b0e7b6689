// `megaplan devices`' outputs.
#include "executor/gpu_inventory_report.h"

#include <cstdio>

#include "core/error.h"
#include "core/text_table.h"
#include "core/units.h"
#include "core/version.h"

namespace megaplan {
namespace {

ProbeOutcome probe_outcome(int device_index) {
  ProbeOutcome outcome;
  try {
    probe_device(device_index);
  } catch (const SpecError& error) {
    outcome.error = error.what();
  }
  return outcome;
}

std::string format_bandwidth(double bytes_per_s) {
  if (bytes_per_s <= 0) return "-";
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.2f TB/s", bytes_per_s / 1e12);
  return buffer;
}

}  // namespace

std::vector<ProbeOutcome> probe_devices(const GpuInventory& inventory) {
  std::vector<ProbeOutcome> probes;
  for (const GpuDevice& device : inventory.devices) probes.push_back(probe_outcome(device.index));
  return probes;
}

void write_gpu_inventory_text(const GpuInventory& inventory, const std::vector<ProbeOutcome>& probes,
                              std::ostream& out) {
  out << "CUDA runtime " << inventory.cuda_runtime.text(false) << ", driver " << inventory.cuda_driver.text(false)
      << "; cuBLAS " << inventory.cublas.text() << "; cuBLASLt " << inventory.cublaslt.text() << "; NCCL "
      << inventory.nccl.text() << "; device code " << built_cuda_architectures() << "\n";

  std::vector<std::string> header{"gpu",       "name", "arch", "SMs", "memory free", "memory total", "memory bandwidth",
                                  "PCI bus id"};
  const bool probed = !probes.empty();
  if (probed) header.push_back("probe");
  TextTable table(header);
  for (size_t i = 0; i < inventory.devices.size(); ++i) {
    const GpuDevice& device = inventory.devices[i];
    std::vector<std::string> row{std::to_string(device.index),
                                 device.name,
                                 device.sm_architecture(),
                                 std::to_string(device.sm_count),
                                 format_bytes(static_cast<double>(device.free_memory_bytes)),
                                 format_bytes(static_cast<double>(device.total_memory_bytes)),
                                 format_bandwidth(device.peak_memory_bandwidth_bytes_per_s()),
                                 device.pci_bus_id};
    if (probed) row.push_back(probes[i].error.empty() ? "ok" : "FAILED");
    table.add_row(std::move(row));
  }
  out << table.render();
  for (const ProbeOutcome& outcome : probes) {
    if (!outcome.error.empty()) out << "probe failed: " << outcome.error << "\n";
  }
}

nlohmann::json gpu_inventory_json(const GpuInventory& inventory, const std::vector<ProbeOutcome>& probes) {
  nlohmann::json devices = nlohmann::json::array();
  for (size_t i = 0; i < inventory.devices.size(); ++i) {
    const GpuDevice& device = inventory.devices[i];
    nlohmann::json entry = {
        {"index", device.index},
        {"name", device.name},
        {"compute_capability",
         std::to_string(device.compute_capability_major) + "." + std::to_string(device.compute_capability_minor)},
        {"sm_count", device.sm_count},
        {"total_memory_bytes", device.total_memory_bytes},
        {"free_memory_bytes", device.free_memory_bytes},
        {"sm_clock_khz", device.sm_clock_khz},
        {"memory_clock_khz", device.memory_clock_khz},
        {"memory_bus_width_bits", device.memory_bus_width_bits},
        {"peak_memory_bandwidth_bytes_per_s", device.peak_memory_bandwidth_bytes_per_s()},
        {"pci_bus_id", device.pci_bus_id},
    };
    if (!probes.empty()) {
      entry["probe"] = probes[i].error.empty() ? nlohmann::json{{"ok", true}}
                                               : nlohmann::json{{"ok", false}, {"error", probes[i].error}};
    }
    devices.push_back(std::move(entry));
  }
  return {
      {"cuda_runtime", inventory.cuda_runtime.text(false)},
      {"cuda_driver", inventory.cuda_driver.text(false)},
      {"cublas", inventory.cublas.text()},
      {"cublaslt", inventory.cublaslt.text()},
      {"nccl", inventory.nccl.text()},
      {"device_code", built_cuda_architectures()},
      {"devices", std::move(devices)},
  };
}

nlohmann::json measurement_provenance(const GpuInventory& inventory, double timing_mark_s, const std::string& date,
                                      const std::string& command) {
  const GpuDevice& device = inventory.devices.at(0);
  return {{"device", device.name},
          {"compute_capability", device.sm_architecture()},
          {"sm_count", device.sm_count},
          {"sm_clock_khz", device.sm_clock_khz},
          {"memory_clock_khz", device.memory_clock_khz},
          {"memory_bus_width_bits", device.memory_bus_width_bits},
          {"cuda_driver", inventory.cuda_driver.text(false)},
          {"cuda_runtime", inventory.cuda_runtime.text(false)},
          {"cublas", inventory.cublas.text()},
          {"cublaslt", inventory.cublaslt.text()},
          {"nccl", inventory.nccl.text()},
          {"timing_mark_s", timing_mark_s},
          {"gpus", static_cast<int64_t>(inventory.devices.size())},
          {"megaplan", kVersion},
          {"date", date},
          {"command", command}};
}

}  // namespace megaplan
