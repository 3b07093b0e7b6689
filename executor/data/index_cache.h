// Where sample indexes are cached, and how a run finds, builds or rebuilds them, as Megatron-LM's
// datasets cache theirs: in --data-cache-path, else beside the data in Megatron's folder
// PREFIX/cache/<Class>_indices; each file named by a hash of what was asked,
// "<hash>-<Class>-<split>-indices.bin" (executor/data/index_file.h), so that another dataset,
// split, length, sample count or seed gets a file of its own.
//
// A file that exists is used as it is, read-only, if its header's description is the request's
// and the files it was built from (the dataset's .bin and .idx) have the size and modification
// time it recorded; otherwise it is stale and is built again. Building takes an exclusive lock on
// the folder (flock), so that of the ranks of one machine, or of several sharing the folder, one
// builds and the others wait and then map its file; where the filesystem has no locks, each builds
// the same bytes and the last rename wins. A folder that cannot be created or written while an
// index must be built there is refused in one line, as is a damaged file (MappedIndexFile).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "executor/data/index_file.h"

namespace megaplan::exec {

struct IndexCache {
  std::optional<std::string> folder;  // --data-cache-path; none: beside each dataset
  int64_t threads = 1;                // building threads (--num-dataset-builder-threads)
  std::ostream* log = nullptr;        // where building and loading are said (rank 0's log); null: nowhere
};

// One index: where it lives, what it is, and what it is built from.
struct IndexRequest {
  std::string folder;               // cache_folder()'s
  std::string field;                // the flag that chose the folder, for errors
  std::string name;                 // "GPTDataset-train": the file's name after the hash
  nlohmann::json description;       // what is asked: hashed into the name, recorded in the header
  std::vector<std::string> inputs;  // files it is built from: size and modification time recorded
  std::string what;                 // for the log: "the training samples of PREFIX"
};

// The folder for `kind`'s ("GPTDataset") indexes of the dataset `prefix`, and the flag that chose it:
// --data-cache-path, else Megatron's PREFIX/cache/<kind>_indices (chosen by --data-path).
std::pair<std::string, std::string> cache_folder(const IndexCache& cache, const std::string& prefix,
                                                 const std::string& kind);

// Writes the index to `path` through an IndexFileWriter over `header` (the description and the
// inputs' stamps), adding its facts and sections, and commits it.
using IndexBuilder = std::function<void(const std::string& path, nlohmann::json header)>;

// The request's index, mapped: the cached file when it is current, else built by `build`. Throws
// SpecError(request.field, ...) when the folder cannot be created or written and the index must be
// built, or when the file is damaged; `build`'s errors.
MappedIndexFile open_or_build_index(const IndexRequest& request, const IndexCache& cache, const IndexBuilder& build);

}  // namespace megaplan::exec
