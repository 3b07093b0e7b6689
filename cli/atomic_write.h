// Writing output files so that a reader (or a crash) never sees half a file.
#pragma once

#include <string>

namespace megaplan::cli {

// Writes `contents` to a temporary file beside `path`, fsyncs it and renames it over `path`.
// On any failure the temporary file is removed, `path` is untouched, and SpecError(path, reason)
// is thrown.
void write_file_atomically(const std::string& path, const std::string& contents);

}  // namespace megaplan::cli
