// The built-in profiles as compiled in equal those read from their JSON files, field for field,
// and a profile's bytes read back equal it.
#include <catch2/catch.hpp>

#include <optional>
#include <string>

#include "core/cluster_spec.h"
#include "simulator/builtin_profiles.h"
#include "simulator/profile.h"

using megaplan::sim::Profile;

TEST_CASE("the compiled built-in profiles equal those read from the JSON", "[simulator][profile]") {
  int compiled = 0;
  for (const megaplan::ClusterSpec& preset : megaplan::cluster_presets()) {
    INFO(preset.name);
    const std::optional<Profile> built_in = megaplan::sim::builtin_profile(preset.gpu);
    const std::optional<Profile> from_json = megaplan::sim::builtin_profile_from_json(preset.gpu);
    REQUIRE(built_in.has_value() == from_json.has_value());
    if (!built_in) continue;
    CHECK(*built_in == *from_json);
    ++compiled;
  }
  CHECK(compiled == static_cast<int>(megaplan::cluster_presets().size()));  // every preset GPU has one
  const std::optional<Profile> a100 = megaplan::sim::builtin_profile(megaplan::cluster_preset("dgx-a100-80gb").gpu);
  REQUIRE(a100);
  CHECK(a100->kind() == megaplan::sim::ProfileKind::kTransferred);
  CHECK(a100->origin() == "profiles/h100-sxm5-80gb.measured.json (built in)");
}

TEST_CASE("a cluster file's GPU of a preset's name but another datasheet is transferred anew", "[simulator][profile]") {
  megaplan::GpuSpec gpu = megaplan::cluster_preset("dgx-a100-80gb").gpu;
  gpu.dense_bf16_flops_per_s *= 2;
  const std::optional<Profile> built_in = megaplan::sim::builtin_profile(gpu);
  REQUIRE(built_in);
  CHECK(*built_in == *megaplan::sim::builtin_profile_from_json(gpu));
  CHECK_FALSE(*built_in == *megaplan::sim::builtin_profile(megaplan::cluster_preset("dgx-a100-80gb").gpu));
}

TEST_CASE("a profile's bytes read back equal it", "[simulator][profile]") {
  const Profile measured = Profile::load(std::string(MEGAPLAN_PROFILES_DIR) + "/h200-sxm-141gb.measured.json");
  CHECK(Profile::from_bytes(measured.to_bytes()) == measured);
  const Profile datasheet = Profile::datasheet(megaplan::cluster_preset("dgx-h100").gpu);
  CHECK(Profile::from_bytes(datasheet.to_bytes()) == datasheet);
  CHECK_FALSE(Profile::from_bytes(datasheet.to_bytes()) == measured);
}
