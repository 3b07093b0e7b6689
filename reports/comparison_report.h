// `megaplan compare`'s outputs: a simulated timeline (`simulate --trace`) against a measured one
// (`train --trace`) of the same plan (reports/timeline_comparison.h), as text or as JSON.
#pragma once

#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/timeline.h"
#include "reports/timeline_comparison.h"

namespace megaplan {

// The timeline of a Chrome trace file megaplan wrote; SpecError under `flag` for a file that cannot
// be read or is not JSON.
Timeline read_chrome_trace_file(const std::string& path, const std::string& flag);

// `simulated` and `measured` name the traces compared.
nlohmann::json comparison_json(const std::string& simulated, const std::string& measured,
                               const TimelineComparison& comparison);
void write_comparison_text(const std::string& simulated, const std::string& measured,
                           const TimelineComparison& comparison, std::ostream& out);

}  // namespace megaplan
