#include "simulator/profile_choice.h"

#include <utility>

#include "core/cluster_spec.h"
#include "core/error.h"
#include "simulator/builtin_profiles.h"

namespace megaplan::sim {
namespace {

// A built-in profile (measured, or transferred from another GPU's), else the datasheet numbers of a
// GPU type of megaplan's cluster presets.
Profile default_profile(const GpuSpec& gpu) {
  if (std::optional<Profile> builtin = builtin_profile(gpu)) return std::move(*builtin);
  std::string known;
  for (const ClusterSpec& preset : cluster_presets()) {
    if (preset.gpu.name == gpu.name) return Profile::datasheet(preset.gpu);
    if (known.find(preset.gpu.name) == std::string::npos) known += (known.empty() ? "" : ", ") + preset.gpu.name;
  }
  throw SpecError("--profile", "no built-in profile for GPU type \"" + gpu.name + "\" (known: " + known +
                                   "); pass --profile FILE for it");
}

}  // namespace

Profile choose_profile(const std::optional<std::string>& profile_file, const GpuSpec& gpu) {
  if (!profile_file) return default_profile(gpu);
  Profile profile = Profile::load(*profile_file);
  if (profile.gpu_name() != gpu.name) {
    throw SpecError("--profile",
                    *profile_file + " profiles " + profile.gpu_name() + ", but the cluster's GPU is " + gpu.name);
  }
  return profile;
}

std::string describe_profile(const Profile& profile) {
  const std::string kind = to_string(profile.kind());
  if (profile.origin() == "datasheet") return profile.gpu_name() + ", " + kind + " (no measured tables)";
  return profile.gpu_name() + ", " + kind + ": " + profile.origin() + "; " + profile.source();
}

nlohmann::json profile_json(const Profile& profile) {
  return {{"gpu", profile.gpu_name()},
          {"kind", to_string(profile.kind())},
          {"uncertainty", profile.uncertainty()},
          {"origin", profile.origin()},
          {"source", profile.source()}};
}

}  // namespace megaplan::sim
