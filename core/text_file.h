// Reading a whole input file, with the one error line the CLI prints when it cannot.
#pragma once

#include <string>

namespace megaplan {

// Throws SpecError(path, "cannot read file: <reason>").
std::string read_text_file(const std::string& path);

}  // namespace megaplan
