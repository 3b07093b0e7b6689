// `megaplan report`: one self-contained HTML file of a plan — summary, alternatives (a search's
// ranked plans), memory per pipeline rank and the timeline — that works offline. The page is
// reports/report_template.html with d3 (Debian's node-d3, embedded at build time) and the plan's
// data inlined; the data is built here from core's types, so that the report renders what the
// simulator computed and nothing else.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/job_spec.h"
#include "core/memory_model.h"
#include "core/timeline.h"
#include "simulator/profile.h"
#include "simulator/simulate_plan.h"

namespace megaplan {

// What the report shows of a simulated plan.
struct PlanReport {
  JobSpec job;
  double iteration_time_s = 0;
  double model_tflops_per_gpu = 0;
  double mfu = 0;
  double bubble_fraction = 0;
  int64_t peak_memory_bytes = 0;
  int64_t memory_capacity_bytes = 0;
  bool fits_in_memory = true;
  std::vector<PipelineRankMemory> memory;  // one per pipeline rank
  Timeline timeline;                       // the simulated iteration
  // The profile that costed it: its GPU, "measured", "transferred" or "datasheet", one line, and
  // its stated uncertainty.
  std::string profile_name, profile_kind, profile_description;
  double profile_uncertainty = 0;
  // The plan as Megatron-LM's arguments (the flags on a line, then "# ..." notes) and as launch
  // lines, as planner/ writes them; either may be empty.
  std::string megatron_arguments;
  std::string launch;
  // `search --json` output whose plans the alternatives section ranks; `search_source` names its
  // file in errors.
  std::optional<nlohmann::json> search;
  std::string search_source;
  // A measured timeline of the same plan (`train --trace`): the measured-against-simulated
  // section; `measured_source` names its file.
  std::optional<Timeline> measured;
  std::string measured_source;
};

// The report of `job` simulated with `profile` (`simulation` recorded its timeline), with
// Megatron-LM's arguments and the launch lines for it; `report`, `simulate --report` and
// `search --report` fill the rest.
PlanReport plan_report(const JobSpec& job, const sim::Profile& profile, sim::PlanSimulation simulation);

// The page's data (window.MEGAPLAN; the schema is the template's). Throws SpecError naming
// `search_source` and the field when the search JSON is not `search --json`'s, or is a search of
// another model or cluster than the job's (check_search_provenance), and
// SpecError("--measured", ...) naming the first difference when the measured timeline does not
// hold the simulated one's actions (a trace of another plan).
nlohmann::json report_data(const PlanReport& report);

// The HTML page of report_data(): the template with d3 and the data inlined.
std::string render_html_report(const nlohmann::json& data);

}  // namespace megaplan
