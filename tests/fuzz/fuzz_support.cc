#include "tests/fuzz/fuzz_support.h"

#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace megaplan::fuzz {

namespace {

class ScratchDirectory {
 public:
  ScratchDirectory() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/megaplan-fuzz-XXXXXX";
    require(::mkdtemp(pattern.data()) != nullptr, "mkdtemp failed");
    path_ = pattern;
  }
  ~ScratchDirectory() {
    std::error_code error;
    std::filesystem::remove_all(path_, error);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

const std::string& scratch_directory() {
  static const ScratchDirectory directory;
  return directory.path();
}

void write_file(const std::string& path, std::string_view bytes) {
  // A new file rather than the old one truncated: ext4 writes a truncated and rewritten file back
  // at close, and the next truncation waits for that: the file targets ran about 40 times slower.
  std::remove(path.c_str());
  std::ofstream file(path, std::ios::binary);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  file.close();
  require(static_cast<bool>(file), "cannot write a scratch file");
}

void require(bool holds, const char* what) {
  if (holds) return;
  std::fprintf(stderr, "megaplan fuzz: %s\n", what);
  std::abort();
}

}  // namespace megaplan::fuzz
