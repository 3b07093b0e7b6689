// What the checkpoint tests compare and expect: a directory's files and a refused load.
#pragma once

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>

#include "core/error.h"

namespace megaplan::test {

// Every file under `directory`, by relative path, with its bytes.
inline std::map<std::string, std::string> files_under(const std::string& directory) {
  namespace fs = std::filesystem;
  std::map<std::string, std::string> files;
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(directory)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream file(entry.path(), std::ios::binary);
    std::ostringstream bytes;
    bytes << file.rdbuf();
    files[fs::relative(entry.path(), directory).string()] = bytes.str();
  }
  return files;
}

// The message of the SpecError naming --load that `load` throws (a test failure when none).
inline std::string load_error(const std::function<void()>& load) {
  try {
    load();
  } catch (const SpecError& error) {
    CHECK(error.field() == "--load");
    return error.what();
  }
  FAIL("no SpecError");
  return "";
}

}  // namespace megaplan::test
