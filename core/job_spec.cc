// JobSpec validation and JSON mapping.
#include "core/job_spec.h"

#include <nlohmann/json.hpp>

#include "core/json_io.h"

namespace megaplan {

void validate_job(const JobSpec& job) {
  validate_model_spec(job.model);
  validate_cluster_spec(job.cluster);
  validate_plan(job.model, job.plan);
  if (job.plan.world_size() != job.cluster.total_gpus()) {
    throw SpecError("--gpus", "world size tp*pp*cp*dp = " + std::to_string(job.plan.world_size()) +
                                  " must equal the job's GPU count " + std::to_string(job.cluster.total_gpus()));
  }
}

nlohmann::json job_spec_to_json(const JobSpec& job) {
  return nlohmann::json{{"model", model_spec_to_json(job.model)},
                        {"cluster", cluster_spec_to_json(job.cluster)},
                        {"plan", parallel_plan_to_json(job.plan)}};
}

JobSpec job_spec_from_json(const nlohmann::json& json, const std::string& source) {
  JsonFieldReader reader(json, source);
  const nlohmann::json* model = reader.read_object("model");
  const nlohmann::json* cluster = reader.read_object("cluster");
  const nlohmann::json* plan = reader.read_object("plan");
  for (const auto& [key, value] : {std::pair{"model", model}, {"cluster", cluster}, {"plan", plan}}) {
    if (value == nullptr) throw SpecError(reader.field(key), "required field is missing");
  }
  reader.reject_unknown_keys();
  return JobSpec{model_spec_from_json(*model, source + ": model"),
                 cluster_spec_from_json(*cluster, source + ": cluster"),
                 parallel_plan_from_json(*plan, source + ": plan")};
}

}  // namespace megaplan
