// `megaplan describe`: flag mapping; the outputs are reports/job_description.h's.
#include "cli/describe_command.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/pasted_arguments.h"
#include "core/json_io.h"
#include "executor/io/staged_file.h"
#include "reports/job_description.h"

namespace megaplan::cli {

int run_describe(const DescribeOptions& options, std::ostream& out) {
  const JobSpec job = load_job(options.model, options.cluster, options.plan, options.plan_file, options.given);
  // Write the file before printing, so a failed write leaves no misleading output behind.
  if (options.out) exec::write_file_atomically(*options.out, job_spec_to_json(job).dump(2) + "\n");
  if (options.json) {
    out << job_description_json(job).dump(2) << "\n";
  } else {
    write_job_description(job, out);
  }
  return 0;
}

void setup_describe_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<DescribeOptions>();
  CLI::App* command = app.add_subcommand(
      "describe", "Validate a model + GPUs + parallel plan and show parameters per rank and FLOPs per iteration");
  add_model_options(*command, options->model);
  add_cluster_options(*command, options->cluster);
  add_plan_options(*command, options->plan);
  command->add_option("--plan", options->plan_file, "Job JSON (as written by --out) instead of the flags above");
  command->add_option("--out", options->out, "Write the resolved job JSON to this file (atomically)");
  command->add_flag("--json", options->json, "Print JSON instead of text");
  accept_megatron_arguments(*command);
  command->callback([options, command, &context] {
    options->given = given_flags(*command);
    apply_pasted_vocabulary(read_pasted_arguments(*command, Computes::kCost), options->model);
    context.exit_code = run_describe(*options, context.out);
  });
}

}  // namespace megaplan::cli
