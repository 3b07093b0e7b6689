#include "executor/data/index_cache.h"

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/fnv1a.h"
#include "executor/io/folder_lock.h"

namespace megaplan::exec {

namespace {

// The version of the indexes' orders and of their file: in every description, so that another
// version keys other files rather than misreading these.
constexpr const char* kFormat = "megaplan sample index 1";

std::string hex(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

// Each input's size and modification time, as the header records them.
nlohmann::json stamps(const std::vector<std::string>& inputs) {
  nlohmann::json recorded = nlohmann::json::array();
  for (const std::string& path : inputs) {
    struct stat status {};
    if (::stat(path.c_str(), &status) != 0) {
      throw SpecError("--data-path", path + ": cannot stat: " + std::strerror(errno));
    }
    const int64_t mtime_ns = static_cast<int64_t>(status.st_mtim.tv_sec) * 1000000000 + status.st_mtim.tv_nsec;
    recorded.push_back({{"path", path}, {"bytes", static_cast<int64_t>(status.st_size)}, {"mtime_ns", mtime_ns}});
  }
  return recorded;
}

// Why a cached file cannot serve the request ("" when it can).
std::string staleness(const MappedIndexFile& file, const nlohmann::json& description, const nlohmann::json& inputs) {
  const nlohmann::json& header = file.header();
  if (header.at("description") != description) {
    return "its header describes another request: " + header.at("description").dump();
  }
  const nlohmann::json& recorded = header.at("inputs");
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (i >= recorded.size() || recorded[i] != inputs[i]) {
      return inputs[i].at("path").get<std::string>() + "'s size or modification time changed since it was built";
    }
  }
  return "";
}

bool exists(const std::string& path) {
  struct stat status {};
  return ::stat(path.c_str(), &status) == 0;
}

std::string seconds_since(std::chrono::steady_clock::time_point start) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return text;
}

}  // namespace

std::pair<std::string, std::string> cache_folder(const IndexCache& cache, const std::string& prefix,
                                                 const std::string& kind) {
  if (cache.folder) return {*cache.folder, "--data-cache-path"};
  return {prefix + "/cache/" + kind + "_indices", "--data-path"};
}

MappedIndexFile open_or_build_index(const IndexRequest& request, const IndexCache& cache, const IndexBuilder& build) {
  nlohmann::json description = request.description;
  description["format"] = kFormat;
  const std::string path =
      request.folder + "/" + hex(Fnv1a64().add(description.dump()).value()) + "-" + request.name + "-indices.bin";
  const nlohmann::json inputs = stamps(request.inputs);
  std::string stale;  // why the file there cannot serve, once it has been looked at
  const auto current = [&]() -> std::optional<MappedIndexFile> {
    if (!exists(path)) return std::nullopt;
    MappedIndexFile file(path, request.field);
    stale = staleness(file, description, inputs);
    if (!stale.empty()) return std::nullopt;
    return file;
  };
  const auto say = [&](const std::string& line) {
    if (cache.log) *cache.log << line << "\n";
  };
  if (std::optional<MappedIndexFile> file = current()) {
    say("loaded the index of " + request.what + ": " + path);
    return std::move(*file);
  }

  std::error_code error;
  std::filesystem::create_directories(request.folder, error);
  if (error) {
    throw SpecError(request.field, request.folder + ": cannot create the cache folder (" + error.message() +
                                       "): give --data-cache-path a writable folder");
  }
  if (::access(request.folder.c_str(), W_OK) != 0) {
    const std::string why = std::strerror(errno);
    throw SpecError(request.field, request.folder + " is not writable (" + why + ") and the index of " + request.what +
                                       " must be " +
                                       (stale.empty() ? "built" : "rebuilt, " + path + " being stale: " + stale) +
                                       "; give --data-cache-path a writable folder");
  }
  // Where the folder cannot be locked, builders race, each writing the same bytes.
  const FolderLock lock(request.folder, FolderLock::Wait::kUntilFree);
  if (std::optional<MappedIndexFile> file = current()) {  // another process built it while this one waited
    say("loaded the index of " + request.what + ": " + path);
    return std::move(*file);
  }
  const auto start = std::chrono::steady_clock::now();
  build(path, nlohmann::json{{"description", description}, {"inputs", inputs}});
  say((stale.empty() ? "built the index of " + request.what
                     : "rebuilt the index of " + request.what + " (stale: " + stale + ")") +
      " in " + seconds_since(start) + ": " + path);
  return MappedIndexFile(path, request.field);
}

}  // namespace megaplan::exec
