// The writers of the megaplan-profile/1 file (profiles/README.md), whose reader is
// simulator/profile.h: a measured profile from what the executor's profilers measured
// (core/measured_costs.h), link tables measured on one host or imported from nccl-tests
// (simulator/nccl_tests.h) added to a profile, and a measured profile transferred to another GPU
// (simulator/profile_transfer.h). Each throws SpecError naming the flag (`megaplan profile`'s) and
// the rule.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/cluster_spec.h"
#include "core/measured_costs.h"

namespace megaplan::sim {

// Now, in UTC, as a profile's provenance records it ("2025-01-31T12:00:00Z").
std::string utc_date();

// A profile megaplan wrote must load as the simulator loads it; a refusal is a bug (std::logic_error
// saying `what`).
void check_written_profile(const nlohmann::json& profile, const std::string& what);

// The profile file: `gpu`'s datasheet device rates and roofline, the measured tables, `source`
// and `provenance`. Checked by loading it as the simulator would (a failure is a bug here).
nlohmann::json measured_profile_json(const GpuSpec& gpu, const MeasuredTables& tables, const std::string& source,
                                     const nlohmann::json& provenance);

// `profile` with the link tables measured on one host's GPUs (link "nvlink"): collectives as
// nccl-tests' bus bandwidth, send/receive pairs in seconds (replacing the entries of the same op,
// group size and link, as --import-nccl-tests does) and the `overlap` table, each op's compute
// slowdown (beside / alone - 1, at least 0).
nlohmann::json with_measured_links(nlohmann::json profile, const CommTimings& timings, const std::string& device);

// --import-nccl-tests: the nccl-tests outputs `files` (all of one preset GPU) added to a profile of
// their GPU: `base_file`, else its built-in measured profile, else its datasheet.
nlohmann::json profile_with_nccl_tests(const std::vector<std::string>& files,
                                       const std::optional<std::string>& base_file);

// --transfer-to: the measured profile `measured_file` (else the built-in one simulate would
// transfer) carried over to the preset GPU named `gpu`.
nlohmann::json transferred_profile(const std::string& gpu, const std::optional<std::string>& measured_file);

// A profile file and where it came from.
struct ProfileFile {
  nlohmann::json json;
  std::string origin;
};

// --links-only's base: `base_file`, else the built-in measured profile of `gpu`; it must describe `gpu`.
ProfileFile links_base(const GpuSpec& gpu, const std::optional<std::string>& base_file);

}  // namespace megaplan::sim
