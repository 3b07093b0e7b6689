// The HTML report written as `megaplan report`, `simulate --report`, `search --report` and
// `train --report` write it.
#pragma once

#include <ostream>
#include <string>

#include "reports/html_report.h"

namespace megaplan::cli {

// Renders `report` and writes it to `path` atomically (nothing is written when rendering fails);
// says so in one line.
void write_report(const PlanReport& report, const std::string& path, std::ostream& out);

}  // namespace megaplan::cli
