// The profile a simulation is costed with: a --profile file (checked against the cluster's GPU),
// else the built-in measured profile of the GPU type (profiles/*.measured.json), else another
// GPU's built-in measured profile transferred to it (simulator/profile_transfer.h), else the
// datasheet profile of a GPU type megaplan has presets for. Shared by simulate and search, which
// both say which profile costed their numbers, and of which kind.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/cluster_spec.h"
#include "simulator/profile.h"

namespace megaplan::sim {

// --profile's help, the same wherever a command costs with choose_profile.
inline constexpr const char* kProfileFlagHelp =
    "Kernel and link timings (profiles/*.json); default: the GPU's built-in measured profile, else another GPU's "
    "transferred to it, else its datasheet";

// Throws SpecError("--profile", ...) for a file of another GPU, or a GPU with no built-in profile.
Profile choose_profile(const std::optional<std::string>& profile_file, const GpuSpec& gpu);

// "H100-SXM5-80GB, measured: profiles/h100-sxm5-80gb.measured.json (built in); <its source>".
std::string describe_profile(const Profile& profile);
// {gpu, kind, origin, source} for JSON outputs.
nlohmann::json profile_json(const Profile& profile);

}  // namespace megaplan::sim
