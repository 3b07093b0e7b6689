#include "cli/pasted_arguments.h"

#include <CLI/CLI.hpp>

#include "cli/unexpected_arguments.h"

namespace megaplan::cli {

void accept_megatron_arguments(CLI::App& command) {
  command.allow_extras();
  for (CLI::Option* option : command.get_options()) {
    if (option->get_items_expected_max() == 1) option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }
}

PastedArguments read_pasted_arguments(const CLI::App& command, Computes computes) {
  return megaplan::read_pasted_arguments(command.remaining(), long_flags(command), computes);
}

}  // namespace megaplan::cli
