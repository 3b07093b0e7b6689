// Timelines as Chrome trace JSON (the Trace Event Format), which Perfetto and chrome://tracing
// load: one process per pipeline rank, one thread per stream, one complete ("X") slice per action
// named as the action is written ("0F3") with its microbatch and virtual stage as args, a flow
// arrow ("s" to "f") from each SEND to the RECV it pairs with; and such a trace read back
// (`megaplan compare`).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/job_spec.h"
#include "core/timeline.h"

namespace megaplan {

nlohmann::json timeline_to_chrome_trace(const Timeline& timeline);
// The same with the job's words: each slice's transformer layers in its args, and the model, the
// plan and megaplan's version in the trace's metadata (otherData).
nlohmann::json timeline_to_chrome_trace(const Timeline& timeline, const JobSpec& job);

// The timeline a trace written by timeline_to_chrome_trace holds (`simulate --trace`, `train
// --trace`): its "X" events become slices, metadata events are skipped. Throws SpecError naming
// `file` and the event ("S.json: traceEvents[12]: name: ...") when an event is not such a slice:
// a name that is no action, a thread that is not its action's stream, a negative time.
Timeline timeline_from_chrome_trace(const nlohmann::json& trace, const std::string& file);

}  // namespace megaplan
