// `megaplan presets`' outputs list every model and cluster preset with its source.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <sstream>

#include "core/cluster_spec.h"
#include "core/model_presets.h"
#include "reports/presets_report.h"

using Catch::Matchers::Contains;

TEST_CASE("presets lists every preset in text and JSON", "[presets_report]") {
  std::ostringstream text;
  megaplan::write_presets_text(text);
  for (const megaplan::ModelPreset& preset : megaplan::model_presets())
    CHECK_THAT(text.str(), Contains(preset.spec.name));
  for (const megaplan::ClusterSpec& cluster : megaplan::cluster_presets())
    CHECK_THAT(text.str(), Contains(cluster.name));
  CHECK_THAT(text.str(), Contains("NVIDIA DGX A100 datasheet"));

  const nlohmann::json json = megaplan::presets_json();
  CHECK(json["models"].size() == megaplan::model_presets().size());
  CHECK(json["clusters"].size() == megaplan::cluster_presets().size());
  CHECK(json["models"][0]["total_parameters"] == 124'475'904);
}
