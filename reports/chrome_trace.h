// Timelines as Chrome trace JSON (the Trace Event Format), which Perfetto and chrome://tracing
// load: one process per pipeline rank, one thread per stream, one complete ("X") slice per action
// named as the action is written ("0F3").
#pragma once

#include <nlohmann/json.hpp>

#include "core/timeline.h"

namespace megaplan {

nlohmann::json timeline_to_chrome_trace(const Timeline& timeline);

}  // namespace megaplan
