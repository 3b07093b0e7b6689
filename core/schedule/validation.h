// Schedule validation: every (stage, microbatch) has exactly one forward and one backward (or one
// I and one W), no action repeats another's work (a message or a REDUCE_GRAD included), messages
// pair up in order on every link, and the happens-before graph of program order, messages and data
// dependencies (Boost.Graph) has no cycle — a schedule that would hang NCCL is refused before any
// GPU sees it.
#pragma once

#include <string>

#include "core/error.h"
#include "core/schedule/schedule.h"

namespace megaplan {

// A SpecError (field "schedule", one-line rule naming the actions at fault) that also carries
// the rank x step grid with the offending cell marked, for printing below the error line.
class ScheduleError : public SpecError {
 public:
  ScheduleError(const std::string& rule, std::string grid) : SpecError("schedule", rule), grid_(std::move(grid)) {}
  const std::string& grid() const { return grid_; }

 private:
  std::string grid_;
};

// Throws ScheduleError for the first problem found.
void validate_schedule(const PipelineSchedule& schedule);

}  // namespace megaplan
