// `megaplan schedule`'s outputs: a pipeline schedule rank by rank with each rank's facts (actions,
// compute, peak in-flight microbatches, sends, receives), as text and as JSON.
#pragma once

#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/schedule/schedule.h"

namespace megaplan {

// "pp 4, 8 stages (loop), 16 microbatches, lowered".
std::string describe_schedule_shape(const PipelineSchedule& schedule);

// `title` names the schedule: its kind, or the file it was imported from.
void write_schedule_text(const std::string& title, const PipelineSchedule& schedule, std::ostream& out);
nlohmann::json schedule_json(const std::string& title, const PipelineSchedule& schedule);

// --check's verdict on a schedule that passed validate_schedule: one line.
void write_schedule_verdict(const std::string& title, const PipelineSchedule& schedule, std::ostream& out);

}  // namespace megaplan
