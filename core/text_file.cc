#include "core/text_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>

#include "core/error.h"

namespace megaplan {

namespace {

// A file's identity: its device and inode, and its status-change time, so that a new file that
// reuses the inode of a deleted input (a long-lived process, a test run) is not mistaken for it.
using FileIdentity = std::tuple<dev_t, ino_t, int64_t, int64_t>;

std::optional<FileIdentity> identity_of(const std::string& path) {
  struct stat status {};
  if (::stat(path.c_str(), &status) != 0) return std::nullopt;
  return FileIdentity{status.st_dev, status.st_ino, status.st_ctim.tv_sec, status.st_ctim.tv_nsec};
}

std::mutex inputs_mutex;
std::set<FileIdentity>& inputs() {
  static std::set<FileIdentity> files;
  return files;
}

}  // namespace

void note_input_file(const std::string& path) {
  const std::optional<FileIdentity> identity = identity_of(path);
  if (!identity) return;
  const std::lock_guard<std::mutex> lock(inputs_mutex);
  inputs().insert(*identity);
}

bool is_input_file(const std::string& path) {
  const std::optional<FileIdentity> identity = identity_of(path);
  if (!identity) return false;
  const std::lock_guard<std::mutex> lock(inputs_mutex);
  return inputs().count(*identity) > 0;
}

void forget_input_files() {
  const std::lock_guard<std::mutex> lock(inputs_mutex);
  inputs().clear();
}

std::string read_text_file(const std::string& path) {
  std::string contents = read_file_contents(path);
  note_input_file(path);
  return contents;
}

void require_regular_file(const std::string& path, const std::string& field) {
  struct stat status {};
  if (::stat(path.c_str(), &status) != 0 || S_ISREG(status.st_mode)) return;  // absent: the open says so
  const char* kind = S_ISDIR(status.st_mode)    ? "a directory"
                     : S_ISFIFO(status.st_mode) ? "a FIFO"
                     : S_ISSOCK(status.st_mode) ? "a socket"
                                                : "a device";
  throw SpecError(field, (field == path ? std::string() : path + ": ") + "is " + kind + ", not a regular file");
}

std::string read_file_contents(const std::string& path, std::size_t max_bytes) {
  require_regular_file(path, path);
  const auto too_large = [&] {
    return SpecError(path, "holds more than " + std::to_string(max_bytes) + " bytes, beyond what this file can be");
  };
  struct stat status {};
  if (::stat(path.c_str(), &status) == 0 && static_cast<uint64_t>(status.st_size) > max_bytes) throw too_large();
  std::ifstream file(path, std::ios::binary);
  if (!file) throw SpecError(path, std::string("cannot read file: ") + std::strerror(errno));
  std::string contents;
  char buffer[1 << 16];
  while (file.read(buffer, sizeof buffer) || file.gcount() > 0) {
    contents.append(buffer, static_cast<std::size_t>(file.gcount()));
    if (contents.size() > max_bytes) throw too_large();  // grown since
  }
  if (file.bad()) throw SpecError(path, std::string("cannot read file: ") + std::strerror(errno));
  return contents;
}

}  // namespace megaplan
