// `megaplan describe`'s outputs: a validated job's padded vocabulary, parameters per pipeline rank
// and per GPU, and FLOPs per iteration, as JSON and as text.
#pragma once

#include <ostream>

#include <nlohmann/json.hpp>

#include "core/job_spec.h"

namespace megaplan {

nlohmann::json job_description_json(const JobSpec& job);
void write_job_description(const JobSpec& job, std::ostream& out);

}  // namespace megaplan
