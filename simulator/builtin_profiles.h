// The profiles megaplan ships: the measured ones in profiles/ (*.measured.json), and for other GPUs
// of its cluster presets the nearest of those transferred (profile_transfer.h). The JSON files are
// the source of truth; a build-time step (compile_builtin_profiles.cc) reads them as any profile is
// read and compiles each result into the binary as Profile::to_bytes, so that a command starts
// without parsing hundreds of kilobytes of JSON.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/cluster_spec.h"
#include "simulator/profile.h"

namespace megaplan::sim {

// Whether a measured profile of `gpu_name` is shipped (parses nothing).
bool has_builtin_measured_profile(const std::string& gpu_name);

// A shipped measured profile as its file, for tools that extend it (profile --import-nccl-tests).
// Its origin reads "profiles/<file> (built in)".
struct BuiltinProfileFile {
  nlohmann::json json;
  std::string origin;
};
std::optional<BuiltinProfileFile> builtin_measured_profile_file(const std::string& gpu_name);

// The built-in profile of `gpu`, read from the JSON files: the shipped measured profile, else one
// transferred from another GPU's (builtin_transferred_profile); nullopt when there is neither.
std::optional<Profile> builtin_profile_from_json(const GpuSpec& gpu);

// The same profile: compiled in for the GPUs of megaplan's cluster presets, read from the JSON for
// another (a cluster file's GPU, since a transferred profile depends on the GPU's datasheet).
// In megaplan_simulator only: the build step that compiles the profiles links the JSON reader alone.
std::optional<Profile> builtin_profile(const GpuSpec& gpu);

}  // namespace megaplan::sim
