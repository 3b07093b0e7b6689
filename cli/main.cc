// megaplan: the command-line entry point. Wires the subcommands and is the single error
// boundary: bad input becomes one line on stderr and exit code 2.
#include <algorithm>
#include <array>
#include <cstdio>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/strict_numbers.h"
#include "cli/unexpected_arguments.h"
#include "core/error.h"
#include "core/heap_tuning.h"
#include "core/notes.h"
#include "core/schedule/validation.h"
#include "core/version.h"

namespace {

// The error line in one write: ranks under `megaplan launch` failing together must not cut each
// other's lines (std::cerr writes each << on its own).
void print_error(const std::string& text, const std::string& after = "\n") {
  const std::string line = "megaplan: error: " + megaplan::printable_line(text) + after;
  std::cerr.write(line.data(), static_cast<std::streamsize>(line.size()));
}

// Each subcommand by the name its setup gives it (the end-to-end test asks every one for --help).
struct Subcommand {
  const char* name;
  void (*setup)(CLI::App&, megaplan::cli::CommandContext&);
};
constexpr std::array<Subcommand, 14> kSubcommands = {{{"compare", megaplan::cli::setup_compare_command},
                                                      {"convert", megaplan::cli::setup_convert_command},
                                                      {"data", megaplan::cli::setup_data_command},
                                                      {"describe", megaplan::cli::setup_describe_command},
                                                      {"devices", megaplan::cli::setup_devices_command},
                                                      {"groups", megaplan::cli::setup_groups_command},
                                                      {"launch", megaplan::cli::setup_launch_command},
                                                      {"presets", megaplan::cli::setup_presets_command},
                                                      {"profile", megaplan::cli::setup_profile_command},
                                                      {"schedule", megaplan::cli::setup_schedule_command},
                                                      {"search", megaplan::cli::setup_search_command},
                                                      {"simulate", megaplan::cli::setup_simulate_command},
                                                      {"report", megaplan::cli::setup_report_command},
                                                      {"train", megaplan::cli::setup_train_command}}};

}  // namespace

int main(int argc, char** argv) {
  megaplan::keep_freed_memory_for_reuse();
  // Each line as it is printed, whatever stdout is (a terminal, a pipe to tee, Slurm's log file).
  std::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ);
  using megaplan::cli::CommandContext;
  CLI::App app{"megaplan: plan, simulate and run Megatron-style parallel training layouts", "megaplan"};
  app.set_version_flag("--version", std::string("megaplan ") + megaplan::kVersion);
  app.require_subcommand(1);

  CommandContext context{std::cout};
  // A command line that names a subcommand first sets up that one alone: every other's flags would
  // cost a simulate about a tenth of its instructions. Help, the version and mistakes see them all.
  const std::string first = argc > 1 ? argv[1] : "";
  const bool named = std::any_of(kSubcommands.begin(), kSubcommands.end(),
                                 [&first](const Subcommand& subcommand) { return first == subcommand.name; });
  for (const Subcommand& subcommand : kSubcommands) {
    if (!named || first == subcommand.name) subcommand.setup(app, context);
  }
  megaplan::cli::require_strict_numbers(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForAllHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForVersion& version) {
    return app.exit(version);
  } catch (const CLI::ExtrasError& error) {
    print_error(megaplan::cli::unexpected_arguments_line(app, error.what()));
    return 2;
  } catch (const CLI::ParseError& error) {
    print_error(error.what(), " (see megaplan --help)\n");
    return 2;
  } catch (const megaplan::ScheduleError& error) {
    // The one error line, then the rank x step grid with the actions at fault marked >>so<<.
    print_error(error.what(), "\n" + error.grid());
    return 2;
  } catch (const megaplan::SpecError& error) {
    print_error(error.what());
    return 2;
  } catch (const std::exception& error) {
    print_error(error.what());
    return 1;
  }
  if (context.exit_code == 0) megaplan::flush_notes(std::cerr);
  return context.exit_code;
}
