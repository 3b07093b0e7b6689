// `megaplan simulate`: one plan through the discrete-event simulator: iteration time, model
// TFLOP/s per GPU, MFU, bubble, exposed communication by kind, memory per pipeline rank and
// whether it fits; `--trace` writes the timeline as a Chrome trace.
// Flag mapping; the outputs are reports/simulation_report.h's.
#include <algorithm>
#include <iostream>
#include <memory>
#include <optional>
#include <ostream>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/pasted_arguments.h"
#include "cli/report_command.h"
#include "cli/shared_options.h"
#include "core/error.h"
#include "core/executor_support.h"
#include "core/pipeline_layout.h"
#include "core/schedule/lowering.h"
#include "core/schedule/schedule_csv.h"
#include "core/schedule/validation.h"
#include "executor/io/staged_file.h"
#include "reports/chrome_trace.h"
#include "reports/simulation_report.h"
#include "simulator/profile_choice.h"
#include "simulator/simulate_plan.h"

namespace megaplan::cli {
namespace {

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

int run_simulate(const SimulateOptions& options, std::ostream& out) {
  const JobSpec job = load_job(options.model, options.cluster, options.plan, options.plan_file, options.given);
  // Costed all the same (the plan is legal), but megaplan's own executor would refuse to train it.
  note_executor_refusals(job.model, job.plan);
  const sim::Profile profile = sim::choose_profile(options.profile, job.cluster.gpu);
  std::optional<PipelineSchedule> imported;
  if (options.schedule_csv) {
    imported = read_plan_schedule_csv(*options.schedule_csv, job.plan, "--schedule-csv");
    validate_schedule(lower_schedule(*imported));  // one that would hang is refused, as train refuses it
  }
  const sim::PlanSimulation simulation = sim::simulate_plan(
      job, profile, sim::Topology(job.cluster), options.trace || options.report, imported ? &*imported : nullptr);
  if (options.trace) {
    nlohmann::json trace = timeline_to_chrome_trace(simulation.result.timeline, job, options.trace_detail);
    trace["otherData"]["profile"] = sim::describe_profile(profile);  // what costed the slices
    exec::write_file_atomically(*options.trace, trace.dump() + "\n");
  }
  if (options.json) {
    out << simulation_json(job, profile, simulation).dump(2) << "\n";
  } else {
    write_simulation_text(job, profile, simulation, out);
  }
  // After the output: --json's stays one JSON document on stdout, the report's line goes to stderr.
  if (options.report)
    write_report(plan_report(job, profile, simulation), *options.report, options.json ? std::cerr : out);
  return 0;
}

}  // namespace

void setup_simulate_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<SimulateOptions>();
  CLI::App* command = app.add_subcommand(
      "simulate", "Simulate one plan: iteration time, TFLOP/s, MFU, bubble, communication, memory per stage");
  add_model_options(*command, options->model);
  add_cluster_options(*command, options->cluster);
  add_plan_options(*command, options->plan);
  command->add_option("--plan", options->plan_file,
                      "Job JSON (as describe --out writes it) instead of the flags above");
  command->add_option("--profile", options->profile, sim::kProfileFlagHelp);
  CLI::Option* trace =
      command->add_option("--trace", options->trace, "Write the simulated timeline as a Chrome trace (Perfetto) here");
  command
      ->add_flag("--trace-detail", options->trace_detail,
                 "In the trace, each layer's tensor- and context-parallel collectives as slices of their own")
      ->needs(trace);
  command->add_option("--schedule-csv", options->schedule_csv,
                      "Cost this compute-only torch schedule CSV (torchtitan's pipeline_parallel_schedule_csv) instead "
                      "of the plan's generated schedule; it must have the plan's shape");
  command->add_flag("--json", options->json, "Print JSON instead of text");
  command->add_option("--report", options->report, "Write the plan's HTML report here (as `megaplan report`)");
  accept_megatron_arguments(*command);
  command->callback([options, command, &context] {
    options->given = given_flags(*command);
    apply_pasted_vocabulary(read_pasted_arguments(*command, Computes::kCost), options->model);
    context.exit_code = run_simulate(*options, context.out);
  });
}

}  // namespace megaplan::cli
