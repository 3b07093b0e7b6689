// `megaplan report`: the HTML report of one plan (reports/html_report.h): simulated with the
// profile simulate would use, with a search's ranked plans beside it (--search).
#include "cli/report_command.h"

#include <memory>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/shared_options.h"
#include "core/error.h"
#include "core/json_io.h"
#include "core/units.h"
#include "executor/io/staged_file.h"
#include "reports/chrome_trace.h"
#include "reports/html_report.h"
#include "reports/timeline_comparison.h"
#include "simulator/profile_choice.h"
#include "simulator/simulate_plan.h"

namespace megaplan::cli {

void write_report(const PlanReport& report, const std::string& path, std::ostream& out) {
  const std::string page = render_html_report(report_data(report));
  exec::write_file_atomically(path, page);
  out << "wrote " << path << " (" << format_bytes(static_cast<double>(page.size())) << ", "
      << report.timeline.slices.size() << " timeline slices)\n";
}

namespace {

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

int run_report(const ReportOptions& options, std::ostream& out) {
  const JobSpec job = load_job(options.model, options.cluster, options.plan, options.plan_file, options.given);
  const sim::Profile profile = sim::choose_profile(options.profile, job.cluster.gpu);
  PlanReport report = plan_report(job, profile, sim::simulate_plan(job, profile, /*record_timeline=*/true));
  if (options.search) {
    report.search = read_json_file(*options.search);
    report.search_source = *options.search;
  }
  if (options.simulated) {
    // A simulated trace of this plan holds this simulation's actions; one of another plan does not.
    Timeline given = timeline_from_chrome_trace(read_json_file(*options.simulated), *options.simulated);
    check_trace_identity(given, trace_identity(job), "--simulated", "this plan's");
    try {
      (void)compare_timelines(report.timeline, given);
    } catch (const SpecError& error) {
      throw SpecError("--simulated", *options.simulated + " is not a trace of this plan: " + error.rule());
    }
    report.timeline = std::move(given);
  }
  if (options.measured) {
    report.measured = timeline_from_chrome_trace(read_json_file(*options.measured), *options.measured);
    check_trace_identity(*report.measured, trace_identity(job), "--measured", "this plan's");
    report.measured_source = *options.measured;
  }
  write_report(report, options.out, out);
  return 0;
}

}  // namespace

void setup_report_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<ReportOptions>();
  CLI::App* command =
      app.add_subcommand("report", "One self-contained HTML report of a plan: summary, alternatives, memory, timeline");
  add_model_options(*command, options->model);
  add_cluster_options(*command, options->cluster);
  add_plan_options(*command, options->plan);
  command->add_option("--plan", options->plan_file,
                      "Job JSON (search --out, describe --out) instead of the flags above");
  command->add_option("--search", options->search, "`search --json` output: its ranked plans as the alternatives");
  command->add_option("--profile", options->profile, "Kernel and link timings; default: simulate's");
  command->add_option("--measured", options->measured,
                      "`train --trace` of the same plan: its timeline against the simulated one, per-action residuals");
  command->add_option("--simulated", options->simulated, "`simulate --trace` of the plan: the timeline to show");
  command->add_option("--out", options->out, "The HTML file to write")->required();
  command->callback([options, command, &context] {
    options->given = given_flags(*command);
    context.exit_code = run_report(*options, context.out);
  });
}

}  // namespace megaplan::cli
