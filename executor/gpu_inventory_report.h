// The inventory (executor/gpu_inventory.h) described: `megaplan devices`' outputs (with --probe,
// each device's probe) as a text table or as one JSON object, and the provenance `megaplan profile`
// records.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "executor/gpu_inventory.h"

namespace megaplan {

// The outcome of probing one device: no error text means it passed.
struct ProbeOutcome {
  std::string error;
};

// probe_device on every device of the inventory, its SpecError caught as the outcome.
std::vector<ProbeOutcome> probe_devices(const GpuInventory& inventory);

// The versions line, one table row per device (with `probes`: whether it passed), then each
// failure's reason.
void write_gpu_inventory_text(const GpuInventory& inventory, const std::vector<ProbeOutcome>& probes,
                              std::ostream& out);

nlohmann::json gpu_inventory_json(const GpuInventory& inventory, const std::vector<ProbeOutcome>& probes);

// A measured profile's provenance: GPU 0 and the libraries, the GPU count, `timing_mark_s` (the
// marks' own cost, subtracted), megaplan's version, `date` and `command`.
nlohmann::json measurement_provenance(const GpuInventory& inventory, double timing_mark_s, const std::string& date,
                                      const std::string& command);

}  // namespace megaplan
