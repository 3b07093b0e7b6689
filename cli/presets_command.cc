// `megaplan presets`: the built-in model and cluster presets with their key numbers and sources.
// Flag mapping; the outputs are reports/presets_report.h's.
#include <memory>
#include <ostream>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "reports/presets_report.h"

namespace megaplan::cli {
namespace {

struct PresetsOptions {
  bool json = false;
};

int run_presets(const PresetsOptions& options, std::ostream& out) {
  if (options.json) {
    out << presets_json().dump(2) << "\n";
  } else {
    write_presets_text(out);
  }
  return 0;
}

}  // namespace

void setup_presets_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<PresetsOptions>();
  CLI::App* command = app.add_subcommand("presets", "List the built-in model and cluster presets and their sources");
  command->add_flag("--json", options->json, "Print JSON instead of tables");
  command->callback([options, &context] { context.exit_code = run_presets(*options, context.out); });
}

}  // namespace megaplan::cli
