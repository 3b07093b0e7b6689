// What the fuzz targets share: the input as text, a scratch directory for parsers that read files,
// and the one outcome a parser may have besides success.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.h"
#include "core/text_file.h"

namespace megaplan::fuzz {

inline std::string_view as_text(const uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// This process's own directory (mkdtemp under $TMPDIR, else /tmp), made on first use and removed
// at exit: a target that feeds a file reader writes the input there, so that parallel fuzzing
// processes never read each other's files.
const std::string& scratch_directory();

// Writes `bytes` to `path`, replacing it; aborts when it cannot (a broken harness, not a finding).
void write_file(const std::string& path, std::string_view bytes);

// Aborts with `what` when `holds` is false: a broken promise of the code under test is a finding.
void require(bool holds, const char* what);

// Runs `parse` and returns libFuzzer's 0. SpecError is how megaplan refuses bad input; any other
// exception escapes, so libFuzzer reports it (std::terminate aborts) as it reports a crash. The
// files the input was read from are forgotten after it (core/text_file.h): the record of a file
// rewritten for every input would grow by one entry an input, and libFuzzer then runs
// LeakSanitizer after every input (mallocs no longer equal frees), at a twelfth of the speed.
template <typename Parse>
int refusing_only_with_spec_error(Parse&& parse) {
  try {
    parse();
  } catch (const SpecError&) {
  }
  forget_input_files();
  return 0;
}

}  // namespace megaplan::fuzz
