// The built-in profiles read from their JSON files (compile_builtin_profiles.cc compiles them in).
#include "simulator/builtin_profiles.h"

#include "simulator/profile_transfer.h"

namespace megaplan::sim {

std::optional<Profile> builtin_profile_from_json(const GpuSpec& gpu) {
  if (const std::optional<BuiltinProfileFile> file = builtin_measured_profile_file(gpu.name)) {
    return Profile::from_json(file->json, file->origin);
  }
  return builtin_transferred_profile(gpu);
}

}  // namespace megaplan::sim
