// `megaplan simulate`'s outputs: one plan's simulation as JSON and as text (the summary, a row per
// pipeline rank, and the memory table).
#pragma once

#include <ostream>

#include <nlohmann/json.hpp>

#include "core/job_spec.h"
#include "simulator/profile.h"
#include "simulator/simulate_plan.h"

namespace megaplan {

nlohmann::json simulation_json(const JobSpec& job, const sim::Profile& profile, const sim::PlanSimulation& simulation);
void write_simulation_text(const JobSpec& job, const sim::Profile& profile, const sim::PlanSimulation& simulation,
                           std::ostream& out);

}  // namespace megaplan
