// The profile a simulation is costed with: a --profile file (checked against the cluster's GPU) or
// the datasheet profile of a GPU type megaplan has presets for. Shared by simulate and search.
#pragma once

#include <optional>
#include <string>

#include "core/cluster_spec.h"
#include "simulator/profile.h"

namespace megaplan::cli {

// Throws SpecError("--profile", ...) for a file of another GPU, or a GPU with no built-in profile.
sim::Profile choose_profile(const std::optional<std::string>& profile_file, const GpuSpec& gpu);

}  // namespace megaplan::cli
