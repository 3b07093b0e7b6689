// JobSpec: a model, the GPUs it runs on and the parallel plan — everything `simulate --plan`,
// `report --plan` and `train --plan` need, in one JSON file.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "core/cluster_spec.h"
#include "core/model_spec.h"
#include "core/parallel_plan.h"

namespace megaplan {

struct JobSpec {
  ModelSpec model;
  ClusterSpec cluster;  // already restricted to the job's GPUs (select_gpus)
  ParallelPlan plan;
};

// Validates the model, the cluster, that the plan's world size equals the cluster's GPU count,
// and every plan rule; throws the first SpecError.
void validate_job(const JobSpec& job);

// {"model": ..., "cluster": ..., "plan": ...}, each in its own type's JSON form.
nlohmann::json job_spec_to_json(const JobSpec& job);
JobSpec job_spec_from_json(const nlohmann::json& json, const std::string& source);

}  // namespace megaplan
