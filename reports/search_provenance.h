// What `search --json` records of what it searched — the model, the cluster and the
// implementation, each as core's JSON writes it — and the check `report --search` makes with it: a
// search ranks layouts of one model on one cluster, so its plans are no alternatives to a plan of
// another. The profile is recorded beside these by the command (its "profile" field).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/cluster_spec.h"
#include "core/implementation_options.h"
#include "core/job_spec.h"
#include "core/model_spec.h"

namespace megaplan {

// {"model": {"name", "spec"}, "cluster": {"name", "gpus", "spec"}, "implementation": {"name",
// "options"}}, to merge into the search's JSON; `cluster` is the searched GPUs (select_gpus').
nlohmann::json search_provenance(const ModelSpec& model, const ClusterSpec& cluster, Implementation implementation,
                                 const ImplementationOptions& options);

// Throws SpecError("--search", ...) in one line when `search` (a `search --json` output, named
// `source`) lacks the provenance fields (a search written before megaplan recorded them: re-run
// it), or searched another model or another cluster than `job`'s. Specs are compared, not names:
// a model of the same name with other layers is another model, and a file's name for a preset's
// numbers is the same model. The first field that differs is named with both values. A cluster's
// "source" (its datasheet citations) is text, not a number a plan depends on, and is not compared.
void check_search_provenance(const nlohmann::json& search, const std::string& source, const JobSpec& job);

}  // namespace megaplan
