#include "reports/search_provenance.h"

#include <initializer_list>
#include <optional>

#include "core/error.h"
#include "core/json_io.h"

namespace megaplan {

namespace {

nlohmann::json without_keys(nlohmann::json object, std::initializer_list<const char*> keys) {
  for (const char* key : keys) object.erase(key);
  return object;
}

// `search`'s `section` object's `key`, which must be an object (spec) or an integer (gpus).
const nlohmann::json& recorded_field(const nlohmann::json& search, const std::string& source, const char* section,
                                     const char* key, bool integer) {
  const nlohmann::json& value = search.at(section);
  if (!value.is_object() || !value.contains(key) ||
      (integer ? !value.at(key).is_number_integer() : !value.at(key).is_object())) {
    throw SpecError("--search", source + ": " + section + "." + key + ": must be " +
                                    (integer ? "an integer" : "an object") + ", as `megaplan search --json` writes it");
  }
  return value.at(key);
}

}  // namespace

nlohmann::json search_provenance(const ModelSpec& model, const ClusterSpec& cluster, Implementation implementation,
                                 const ImplementationOptions& options) {
  return {
      {"model", {{"name", model.name}, {"spec", model_spec_to_json(model)}}},
      {"cluster", {{"name", cluster.name}, {"gpus", cluster.total_gpus()}, {"spec", cluster_spec_to_json(cluster)}}},
      {"implementation", {{"name", to_string(implementation)}, {"options", implementation_options_to_json(options)}}}};
}

void check_search_provenance(const nlohmann::json& search, const std::string& source, const JobSpec& job) {
  if (!search.is_object() || !search.contains("model") || !search.contains("cluster")) {
    throw SpecError("--search", source +
                                    " records no model and cluster (a search written before megaplan recorded "
                                    "them), so it cannot be matched to this plan: re-run `megaplan search --json`");
  }
  const nlohmann::json& model = recorded_field(search, source, "model", "spec", false);
  const std::string searched_model = search.at("model").value("name", std::string("?"));
  if (const std::optional<std::string> difference = first_json_difference(
          without_keys(model, {"name"}), without_keys(model_spec_to_json(job.model), {"name"}), "")) {
    throw SpecError("--search", source + " is a search of another model" +
                                    (searched_model == job.model.name ? "" : " (" + searched_model + ")") +
                                    " than this plan's " + job.model.name + ": " + *difference);
  }
  const int64_t gpus = recorded_field(search, source, "cluster", "gpus", true).get<int64_t>();
  const nlohmann::json& cluster = recorded_field(search, source, "cluster", "spec", false);
  const std::string searched_cluster = search.at("cluster").value("name", std::string("?"));
  if (gpus != job.cluster.total_gpus()) {
    const auto count = [](int64_t n) { return std::to_string(n) + (n == 1 ? " GPU" : " GPUs"); };
    throw SpecError("--search", source + " is a search of " + count(gpus) + " of " + searched_cluster +
                                    "; this plan runs on " + count(job.cluster.total_gpus()) + " of " +
                                    job.cluster.name);
  }
  if (const std::optional<std::string> difference =
          first_json_difference(without_keys(cluster, {"name", "source"}),
                                without_keys(cluster_spec_to_json(job.cluster), {"name", "source"}), "")) {
    throw SpecError("--search", source + " is a search of another cluster" +
                                    (searched_cluster == job.cluster.name ? "" : " (" + searched_cluster + ")") +
                                    " than this plan's " + job.cluster.name + ": " + *difference);
  }
}

}  // namespace megaplan
