// The measured profiles shipped in profiles/ (*.measured.json), compiled into the binary so that
// megaplan costs kernels from measurements wherever it runs: the default profile for their GPUs.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "simulator/profile.h"

namespace megaplan::sim {

// Whether a measured profile of `gpu_name` is shipped (parses nothing).
bool has_builtin_measured_profile(const std::string& gpu_name);

// The shipped measured profile of `gpu_name` (core's cluster spec name), if one was measured.
// Its origin reads "profiles/<file> (built in)".
std::optional<Profile> builtin_measured_profile(const std::string& gpu_name);

// The same as its file, for tools that extend it (profile --import-nccl-tests).
struct BuiltinProfileFile {
  nlohmann::json json;
  std::string origin;
};
std::optional<BuiltinProfileFile> builtin_measured_profile_file(const std::string& gpu_name);

}  // namespace megaplan::sim
