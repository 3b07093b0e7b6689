#include "cli/profile_choice.h"

#include "core/cluster_spec.h"
#include "core/error.h"

namespace megaplan::cli {
namespace {

// The GPU types megaplan has datasheet numbers for: those of its cluster presets.
sim::Profile default_profile(const GpuSpec& gpu) {
  std::string known;
  for (const ClusterSpec& preset : cluster_presets()) {
    if (preset.gpu.name == gpu.name) return sim::Profile::datasheet(preset.gpu);
    if (known.find(preset.gpu.name) == std::string::npos) known += (known.empty() ? "" : ", ") + preset.gpu.name;
  }
  throw SpecError("--profile", "no built-in profile for GPU type \"" + gpu.name + "\" (known: " + known +
                                   "); pass --profile FILE for it");
}

}  // namespace

sim::Profile choose_profile(const std::optional<std::string>& profile_file, const GpuSpec& gpu) {
  if (!profile_file) return default_profile(gpu);
  sim::Profile profile = sim::Profile::load(*profile_file);
  if (profile.gpu_name() != gpu.name) {
    throw SpecError("--profile", *profile_file + " profiles " + profile.gpu_name() + ", but the cluster's GPU is " +
                                     gpu.name);
  }
  return profile;
}

}  // namespace megaplan::cli
