// Numeric flags read as argparse reads Megatron-LM's: an integer flag takes decimal digits only
// ("010" is ten, as Python's int() reads it; no hex, no exponent) within 64 bits — CLI11 alone
// would read "010" as octal 8 and clamp 9223372036854775808 silently — and a real-valued flag
// takes a finite number (nan and inf would train on, or cost, nothing meaningful).
#pragma once

namespace CLI {
class App;
}

namespace megaplan::cli {

// Adds the checks to every integer and real-valued option of `app` and its subcommands, however
// deep. Call once every option is added.
void require_strict_numbers(CLI::App& app);

}  // namespace megaplan::cli
