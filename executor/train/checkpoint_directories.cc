// The checkpoint directories a run names (--load, --save), checked before training starts.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/units.h"
#include "executor/train/checkpoint.h"

namespace megaplan::exec {

bool same_directory(const std::string& a, const std::string& b) {
  std::error_code error;
  const std::filesystem::path first = std::filesystem::weakly_canonical(a, error);
  if (error) return false;
  const std::filesystem::path second = std::filesystem::weakly_canonical(b, error);
  return !error && first == second;
}

void check_checkpoint_directories(const std::optional<std::string>& load, const std::optional<std::string>& save,
                                  int64_t checkpoint_bytes) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (load) {
    const fs::file_status status = fs::status(*load, error);
    if (fs::exists(status) && !fs::is_directory(status)) {
      throw SpecError("--load", *load + " is not a directory");
    }
    if (!fs::exists(status) && !(save && same_directory(*load, *save))) {
      throw SpecError("--load", *load +
                                    " does not exist; to start from scratch and resume from it later, give the "
                                    "same directory to --save (Megatron's resume-or-start idiom)");
    }
  }
  if (!save) return;
  // The directory, or the nearest ancestor a save would create it in.
  fs::path existing = fs::absolute(*save, error);
  while (!fs::exists(existing, error) && existing.has_parent_path() && existing != existing.parent_path()) {
    existing = existing.parent_path();
  }
  if (!fs::is_directory(existing, error)) {
    throw SpecError("--save", existing.string() +
                                  (existing == fs::absolute(*save, error) ? "" : ", on the way to " + *save) +
                                  ", is not a directory");
  }
  if (::access(existing.c_str(), W_OK | X_OK) != 0) {
    throw SpecError("--save", existing.string() + ": cannot write there: " + std::strerror(errno));
  }
  const fs::space_info space = fs::space(existing, error);
  if (!error && space.available < static_cast<std::uintmax_t>(checkpoint_bytes)) {
    throw SpecError("--save", existing.string() + " has " + format_gib(static_cast<double>(space.available)) +
                                  " free, but a checkpoint of this model takes " +
                                  format_gib(static_cast<double>(checkpoint_bytes)));
  }
}

SaveFolderLock::SaveFolderLock(const std::optional<std::string>& save) {
  if (!save) return;
  std::error_code error;
  if (std::filesystem::create_directories(*save, error)) created_ = *save;
  if (error) throw SpecError("--save", *save + ": cannot create the directory: " + error.message());
  lock_ = std::make_unique<FolderLock>(*save, FolderLock::Wait::kNot);
  if (lock_->busy()) {
    lock_.reset();
    throw SpecError("--save", *save +
                                  " is being saved into by another run (it holds the folder's lock); wait for it to "
                                  "end or give another folder");
  }
}

SaveFolderLock::~SaveFolderLock() {
  lock_.reset();
  std::error_code error;
  if (!created_.empty() && std::filesystem::is_empty(created_, error) && !error) {
    std::filesystem::remove(created_, error);
  }
}

}  // namespace megaplan::exec
