// The one line for arguments a command does not take (CLI11's ExtrasError), argparse's way: the
// first such argument, the command, and the nearest flag the command has.
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace megaplan::cli {

// Every long flag of `command` ("--tp", "--tensor-model-parallel-size"), for did-you-mean.
std::vector<std::string> long_flags(const CLI::App& command);

// REQUIRES: `app` threw CLI::ExtrasError from parse(); `what` is that error's message, which ends
// with the arguments ("The following arguments were not expected: 2 --pps").
std::string unexpected_arguments_line(const CLI::App& app, const std::string& what);

}  // namespace megaplan::cli
