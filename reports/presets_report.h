// `megaplan presets`' outputs: the built-in model and cluster presets with their key numbers and
// sources, as two tables and the sources, or as JSON (each preset as its spec file holds it).
#pragma once

#include <ostream>

#include <nlohmann/json.hpp>

namespace megaplan {

nlohmann::json presets_json();
void write_presets_text(std::ostream& out);

}  // namespace megaplan
