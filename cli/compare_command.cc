// `megaplan compare --simulated S.json --measured M.json`: a simulated timeline (`simulate
// --trace`) against a measured one (`train --trace`) of the same plan: per pipeline rank and action
// kind, the predicted and measured time per action and the error, each rank's span, the iteration
// time's error, and whether each rank ran its compute actions in the simulated order. `--json`
// prints the same as JSON.
// Flag mapping; the outputs are reports/comparison_report.h's.
#include <memory>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "reports/chrome_trace.h"
#include "reports/comparison_report.h"

namespace megaplan::cli {
namespace {

struct CompareOptions {
  std::string simulated;  // Chrome trace files, as megaplan writes them
  std::string measured;
  bool json = false;
};

int run_compare(const CompareOptions& options, std::ostream& out) {
  const Timeline simulated = read_chrome_trace_file(options.simulated, "--simulated");
  const Timeline measured = read_chrome_trace_file(options.measured, "--measured");
  check_trace_identity(measured, simulated.identity, "--measured", options.simulated + "'s");
  const TimelineComparison comparison = compare_timelines(simulated, measured);
  if (options.json) {
    out << comparison_json(options.simulated, options.measured, comparison).dump(2) << "\n";
  } else {
    write_comparison_text(options.simulated, options.measured, comparison, out);
  }
  return 0;
}

}  // namespace

void setup_compare_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<CompareOptions>();
  CLI::App* command = app.add_subcommand(
      "compare", "A simulated timeline against a measured one of the same plan, per rank and action kind");
  command->add_option("--simulated", options->simulated, "Chrome trace from simulate --trace")->required();
  command->add_option("--measured", options->measured, "Chrome trace from train --trace")->required();
  command->add_flag("--json", options->json, "Print JSON instead of text");
  command->callback([options, &context] { context.exit_code = run_compare(*options, context.out); });
}

}  // namespace megaplan::cli
