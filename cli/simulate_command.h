// `megaplan simulate`: one plan through the discrete-event simulator: iteration time, model
// TFLOP/s per GPU, MFU, bubble, exposed communication by kind, memory per pipeline rank and
// whether it fits; `--trace` writes the timeline as a Chrome trace.
#pragma once

#include <optional>
#include <ostream>
#include <string>

#include "cli/shared_options.h"

namespace megaplan::cli {

struct SimulateOptions {
  ModelOptions model;
  ClusterOptions cluster;
  PlanOptions plan;
  std::optional<std::string> plan_file;     // a job JSON (as describe --out writes it) instead of flags
  GivenFlags given;                         // job flags given beside --plan: they override it (given_flags)
  std::optional<std::string> profile;       // default: the GPU's datasheet profile
  std::optional<std::string> trace;         // write the Chrome trace here (atomically)
  bool trace_detail = false;                // with it, the tp/cp collectives as slices of their own
  std::optional<std::string> schedule_csv;  // a compute-only torch schedule CSV costed instead of the plan's
  std::optional<std::string> report;        // write the HTML report here (atomically)
  bool json = false;
};

int run_simulate(const SimulateOptions& options, std::ostream& out);

}  // namespace megaplan::cli
