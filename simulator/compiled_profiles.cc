// The built-in profiles as compiled in (builtin_profiles.h): bytes that
// megaplan_compile_builtin_profiles wrote at build time, read back with no JSON parse.
#include <algorithm>
#include <string_view>
#include <utility>

#include "simulator/builtin_profiles.h"

namespace megaplan::sim {

namespace {

// The literals are longer than ISO C++ promises to support; GCC and Clang take them.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Woverlength-strings"
// GPU name, Profile::to_bytes.
const std::pair<std::string_view, std::string_view> kCompiledProfiles[] = {
#include "generated/simulator/compiled_profiles.inc"
};
#pragma GCC diagnostic pop

}  // namespace

std::optional<Profile> builtin_profile(const GpuSpec& gpu) {
  const auto is_preset = [&gpu](const ClusterSpec& preset) {
    const GpuSpec& spec = preset.gpu;
    return spec.name == gpu.name && spec.dense_bf16_flops_per_s == gpu.dense_bf16_flops_per_s &&
           spec.dense_fp16_flops_per_s == gpu.dense_fp16_flops_per_s &&
           spec.hbm_capacity_bytes == gpu.hbm_capacity_bytes &&
           spec.hbm_bandwidth_bytes_per_s == gpu.hbm_bandwidth_bytes_per_s &&
           spec.streaming_multiprocessors == gpu.streaming_multiprocessors;
  };
  if (std::ranges::any_of(cluster_presets(), is_preset)) {
    for (const auto& [name, bytes] : kCompiledProfiles) {
      if (name == gpu.name) return Profile::from_bytes(bytes);
    }
    return std::nullopt;
  }
  return builtin_profile_from_json(gpu);
}

}  // namespace megaplan::sim
