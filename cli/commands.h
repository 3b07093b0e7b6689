// The subcommands of the `megaplan` binary. Each lives in its own file with an options struct,
// a `run_x(options, out)` that is testable without parsing, and a `setup_x_command` that maps
// flags onto the options with CLI11. main.cc only wires them and owns the error boundary.
#pragma once

#include <ostream>

namespace CLI {
class App;
}

namespace megaplan::cli {

// Where commands write, and the exit code the chosen command returned.
struct CommandContext {
  std::ostream& out;
  int exit_code = 0;
};

void setup_compare_command(CLI::App& app, CommandContext& context);
void setup_convert_command(CLI::App& app, CommandContext& context);
void setup_data_command(CLI::App& app, CommandContext& context);
void setup_describe_command(CLI::App& app, CommandContext& context);
void setup_devices_command(CLI::App& app, CommandContext& context);
void setup_groups_command(CLI::App& app, CommandContext& context);
void setup_launch_command(CLI::App& app, CommandContext& context);
void setup_presets_command(CLI::App& app, CommandContext& context);
void setup_profile_command(CLI::App& app, CommandContext& context);
void setup_report_command(CLI::App& app, CommandContext& context);
void setup_schedule_command(CLI::App& app, CommandContext& context);
void setup_search_command(CLI::App& app, CommandContext& context);
void setup_simulate_command(CLI::App& app, CommandContext& context);
void setup_train_command(CLI::App& app, CommandContext& context);

}  // namespace megaplan::cli
