// Saves are atomic (checkpoint.h): a checkpoint is written into a staging directory,
// iter_XXXXXXX.tmp, and moved into place whole once every rank has synced its files.
#pragma once

#include <cstdint>
#include <string>

namespace megaplan::exec::checkpoint_format {

// Creates DIR (and parents), removes what interrupted saves left in it, and creates an empty
// staging directory for `iteration`, whose path it returns. Throws SpecError("--save", ...).
std::string create_staging(const std::string& directory, int64_t iteration);
// Moves a complete staging directory into place as `iteration` and makes it the newest
// (latest_checkpointed_iteration.txt). Throws SpecError("--save", ...).
void publish(const std::string& directory, const std::string& staging, int64_t iteration);

}  // namespace megaplan::exec::checkpoint_format
