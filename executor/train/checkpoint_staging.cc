#include "executor/train/checkpoint_staging.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc 2.28)

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/error.h"
#include "executor/io/staged_file.h"
#include "executor/train/checkpoint_format.h"

namespace megaplan::exec::checkpoint_format {

namespace {

// What interrupted saves leave in DIR: iter_XXXXXXX.tmp directories and the temporaries of
// latest_checkpointed_iteration.txt (StagedFile's NAME.tmp.XXXXXX). Only one save writes to a
// directory at a time, so every one of them is stale when a save starts.
void remove_stale_temporaries(const std::string& directory) {
  namespace fs = std::filesystem;
  std::error_code error;
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(directory, error)) {
    const std::string name = entry.path().filename().string();
    const bool staging = name.rfind("iter_", 0) == 0 && name.size() > 4 && name.ends_with(".tmp");
    const bool latest = name.rfind("latest_checkpointed_iteration.txt.tmp.", 0) == 0;
    if (staging || latest) stale.push_back(entry.path());
  }
  for (const fs::path& path : stale) fs::remove_all(path, error);
}

}  // namespace

std::string create_staging(const std::string& directory, int64_t iteration) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::create_directories(directory, error);
  if (error) throw SpecError("--save", directory + ": cannot create: " + error.message());
  remove_stale_temporaries(directory);
  const std::string staging = directory + "/" + iteration_directory(iteration) + ".tmp";
  if (!fs::create_directory(staging, error)) {
    throw SpecError("--save", staging + ": cannot create: " + (error ? error.message() : std::string("exists")));
  }
  return staging;
}

void publish(const std::string& directory, const std::string& staging, int64_t iteration) {
  namespace fs = std::filesystem;
  std::error_code error;
  const std::string final_path = directory + "/" + iteration_directory(iteration);
  sync_directory(staging);
  if (fs::exists(final_path)) {
    // A save at an iteration saved before (a resumed run, or `latest` itself): the two directories
    // swap in one step, so the iteration `latest` names is complete at every instant; the old one,
    // now under the staging name, goes after.
    if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) != 0) {
      throw SpecError("--save", final_path + ": cannot swap the new save into place: " + std::strerror(errno));
    }
    sync_directory(directory);
    fs::remove_all(staging, error);
  } else {
    fs::rename(staging, final_path, error);
    if (error) throw SpecError("--save", final_path + ": cannot rename into place: " + error.message());
    sync_directory(directory);
  }
  write_file_atomically(directory + "/latest_checkpointed_iteration.txt", std::to_string(iteration) + "\n");
}

}  // namespace megaplan::exec::checkpoint_format
