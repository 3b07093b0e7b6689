// `megaplan presets`: the built-in model and cluster presets with their key numbers and sources.
#pragma once

#include <ostream>

namespace megaplan::cli {

struct PresetsOptions {
  bool json = false;
};

int run_presets(const PresetsOptions& options, std::ostream& out);

}  // namespace megaplan::cli
