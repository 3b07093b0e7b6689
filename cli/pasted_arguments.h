// Megatron-LM's arguments pasted after a command's own flags, as CLI11 hands them over; what is done
// with them is core/pasted_arguments.h's.
#pragma once

#include "core/pasted_arguments.h"

namespace CLI {
class App;
}

namespace megaplan::cli {

// Call after the command's options are added.
void accept_megatron_arguments(CLI::App& command);

// In the command's callback: what was given beyond the command's options (core/pasted_arguments.h).
PastedArguments read_pasted_arguments(const CLI::App& command, Computes computes);

}  // namespace megaplan::cli
