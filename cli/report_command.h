// `megaplan report`: the HTML report of one plan (reports/html_report.h): simulated with the
// profile simulate would use, with a search's ranked plans beside it (--search).
#pragma once

#include <optional>
#include <ostream>
#include <string>

#include "cli/shared_options.h"
#include "reports/html_report.h"
#include "simulator/simulate_plan.h"

namespace megaplan::cli {

struct ReportOptions {
  ModelOptions model;
  ClusterOptions cluster;
  PlanOptions plan;
  std::optional<std::string> plan_file;  // a job JSON (search --out, describe --out)
  GivenFlags given;                      // job flags given beside --plan: they override it (given_flags)
  std::optional<std::string> search;     // `search --json` output: the alternatives section
  std::optional<std::string> profile;
  std::optional<std::string> measured;   // `train --trace` of the same plan: measured against simulated
  std::optional<std::string> simulated;  // `simulate --trace` of the plan: the timeline shown instead of a new one
  std::string out;                       // the HTML file, written atomically
};

int run_report(const ReportOptions& options, std::ostream& out);

// Renders `report` and writes it to `path` atomically (nothing is written when rendering fails);
// says so in one line.
void write_report(const PlanReport& report, const std::string& path, std::ostream& out);

}  // namespace megaplan::cli
