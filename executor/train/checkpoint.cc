#include "executor/train/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc 2.28)
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <stdexcept>
#include <utility>

#include "core/error.h"
#include "core/fnv1a.h"
#include "core/json_io.h"
#include "core/text_file.h"
#include "core/units.h"
#include "executor/io/staged_file.h"

namespace megaplan::exec {

namespace {

constexpr const char* kFormat = "megaplan-checkpoint/2";
constexpr std::size_t kArraysPerTensor = 3;  // value, first moment, second moment
// More elements than any shard holds (16 TiB of fp32): a manifest's shape beyond it is damage, and
// products below it cannot overflow.
constexpr int64_t kMaxTensorElements = int64_t{1} << 42;
// latest_checkpointed_iteration.txt's iteration: a trillion iterations is beyond any run.
constexpr std::size_t kMaxIterationDigits = 12;

std::string iteration_directory(int64_t iteration) {
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07lld", static_cast<long long>(iteration));
  return name;
}

// Megatron's mp_rank_TT (pp = 1) or mp_rank_TT_PPP.
std::string rank_directory(int64_t tensor_parallel_rank, int64_t pipeline_rank, int64_t pipeline_parallel_size) {
  char name[64];
  if (pipeline_parallel_size == 1) {
    std::snprintf(name, sizeof name, "mp_rank_%02lld", static_cast<long long>(tensor_parallel_rank));
  } else {
    std::snprintf(name, sizeof name, "mp_rank_%02lld_%03lld", static_cast<long long>(tensor_parallel_rank),
                  static_cast<long long>(pipeline_rank));
  }
  return name;
}

void sync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

std::string hex(uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

// A checkpoint JSON file's own checksum (state.json's, a manifest's): FNV-1a 64 over the compact
// JSON of its other fields, so that any changed value or key — a flipped digit of
// consumed_samples, of a shard's index — is one clear error, not trained on. Absent in files saved
// before it.
std::string json_checksum(nlohmann::json object) {
  object.erase("fnv1a64");
  const std::string text = object.dump();
  Fnv1a64 hash;
  hash.add(text.data(), text.size());
  return hex(hash.value());
}

// Throws SpecError("--load") when `object` carries a checksum its contents do not match.
void verify_json_checksum(const nlohmann::json& object, const std::string& path) {
  if (!object.contains("fnv1a64") || object["fnv1a64"] == json_checksum(object)) return;
  throw SpecError("--load", path + ": its checksum does not match its contents (FNV-1a 64 " + json_checksum(object) +
                                " computed): the file is corrupted");
}

// One saved shard of a tensor, as its manifest describes it.
struct SavedShard {
  std::string manifest;   // DIR/iter_.../mp_rank_.../manifest.json
  std::string data_file;  // DIR/iter_.../mp_rank_.../model.bin
  std::vector<int64_t> shape, global_shape;
  TensorCut cut;
  uint64_t offset = 0;  // bytes into data_file
  uint64_t checksum = 0;
};

[[noreturn]] void refuse_load(const std::string& rule) { throw SpecError("--load", rule); }

// Reads a rank directory's manifest into `saved` (by tensor name, in directory order).
void read_manifest(const std::string& rank_path, std::map<std::string, std::vector<SavedShard>>& saved) {
  const std::string path = rank_path + "/manifest.json";
  if (!std::filesystem::exists(path)) refuse_load(path + ": missing (the checkpoint is incomplete)");
  const std::optional<nlohmann::json> manifest = try_parse_json(read_file_contents(path));
  if (!manifest || !manifest->is_object() || manifest->value("format", "") != kFormat ||
      !manifest->contains("tensors") || !(*manifest)["tensors"].is_array()) {
    refuse_load(path + ": not a " + std::string(kFormat) + " manifest");
  }
  verify_json_checksum(*manifest, path);
  std::string data_file = "model.bin";
  if (const auto found = manifest->find("data_file"); found != manifest->end()) {
    if (!found->is_string() || found->get<std::string>().find('/') != std::string::npos) {
      refuse_load(path + ": data_file must name a file in its directory");
    }
    data_file = found->get<std::string>();
  }
  int64_t entry_index = 0;
  for (const nlohmann::json& entry : (*manifest)["tensors"]) {
    SavedShard shard;
    shard.manifest = path;
    shard.data_file = rank_path + "/" + data_file;
    // Each field checked for its type and range: a damaged manifest is one line naming the field.
    JsonFieldReader fields(entry, path + ": tensors[" + std::to_string(entry_index++) + "]");
    std::string name, dtype, checksum;
    fields.require("name", name);
    fields.require("dtype", dtype);
    if (dtype != "float32") refuse_load(path + ": " + name + " is " + dtype + ", not float32");
    fields.require("shape", shard.shape);
    fields.require("global_shape", shard.global_shape);
    for (const std::vector<int64_t>* shape : {&shard.shape, &shard.global_shape}) {
      int64_t product = 1;
      for (const int64_t extent : *shape) {
        if (extent <= 0 || __builtin_mul_overflow(product, extent, &product) || product > kMaxTensorElements) {
          refuse_load(path + ": " + name + " has the shape " + shape_text(*shape) + ", not a tensor's");
        }
      }
    }
    const nlohmann::json* shard_object = fields.read_object("shard");
    if (!shard_object) refuse_load(fields.field("shard") + ": required field is missing");
    JsonFieldReader cut_fields(*shard_object, fields.field("shard"));
    shard.cut.dim = -1;  // null: not split
    cut_fields.read("dim", shard.cut.dim);
    cut_fields.require("index", shard.cut.index);
    cut_fields.require("count", shard.cut.count);
    cut_fields.read("chunks", shard.cut.chunks);  // absent before SwiGLU: one block
    fields.require("offset", shard.offset);
    fields.require("fnv1a64", checksum);
    if (checksum.size() != 16 || checksum.find_first_not_of("0123456789abcdef") != std::string::npos) {
      refuse_load(fields.field("fnv1a64") + ": must be 16 hexadecimal digits, got \"" + checksum + "\"");
    }
    shard.checksum = std::stoull(checksum, nullptr, 16);
    const TensorCut& cut = shard.cut;
    if (!cut_fits(shard.global_shape, cut) || shard.shape != part_shape(shard.global_shape, cut)) {
      refuse_load(path + ": " + name + " has shape " + shape_text(shard.shape) + ", which is not part " +
                  std::to_string(cut.index) + " of " + std::to_string(cut.count) + " along dimension " +
                  std::to_string(cut.dim) + " of its global shape " + shape_text(shard.global_shape));
    }
    saved[name].push_back(std::move(shard));
  }
}

// The three arrays (value, first and second moment) of `name`'s part `wanted`, from whichever
// shards were saved, each shard's checksum verified.
std::vector<std::vector<float>> read_tensor(const std::string& name, const std::vector<SavedShard>& shards,
                                            const TensorCut& wanted, std::map<std::string, std::ifstream>& files) {
  // The cut of the first shard found; replicated tensors were saved by every tensor-parallel rank
  // and any one copy serves.
  const TensorCut saved_cut = shards.front().cut;
  std::vector<const SavedShard*> parts(static_cast<std::size_t>(saved_cut.count), nullptr);
  for (const SavedShard& shard : shards) {
    if (shard.cut.count == saved_cut.count && shard.cut.dim == saved_cut.dim && shard.cut.chunks == saved_cut.chunks &&
        !parts[static_cast<std::size_t>(shard.cut.index)]) {
      parts[static_cast<std::size_t>(shard.cut.index)] = &shard;
    }
  }
  std::vector<std::vector<std::vector<float>>> arrays(kArraysPerTensor);  // [array][part]
  for (std::size_t p = 0; p < parts.size(); ++p) {
    if (!parts[p]) {
      refuse_load("the checkpoint holds no part " + std::to_string(p) + " of " + std::to_string(parts.size()) + " of " +
                  name + " (a rank directory is missing)");
    }
    const SavedShard& shard = *parts[p];
    const std::size_t count = elements(shard.shape);
    std::ifstream& file = files[shard.data_file];
    if (!file.is_open()) {
      file.open(shard.data_file, std::ios::binary);
      if (!file) refuse_load(shard.data_file + ": cannot open");
    }
    // The file holds what the manifest says before that much memory is taken for it.
    std::error_code size_error;
    const std::uintmax_t file_size = std::filesystem::file_size(shard.data_file, size_error);
    const std::uintmax_t shard_bytes = kArraysPerTensor * count * sizeof(float);
    if (!size_error && (shard.offset > file_size || shard_bytes > file_size - shard.offset)) {
      refuse_load(shard.data_file + ": ends before " + name + " (" + std::to_string(shard_bytes) + " bytes at offset " +
                  std::to_string(shard.offset) + " of its " + std::to_string(file_size) + ")");
    }
    std::vector<float> bytes(kArraysPerTensor * count);
    file.clear();
    file.seekg(static_cast<std::streamoff>(shard.offset));
    file.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size() * sizeof(float)));
    if (!file) {
      refuse_load(shard.data_file + ": ends before " + name + " (" + std::to_string(bytes.size() * sizeof(float)) +
                  " bytes at offset " + std::to_string(shard.offset) + ")");
    }
    Fnv1a64 checksum;
    checksum.add(bytes.data(), bytes.size() * sizeof(float));
    if (checksum.value() != shard.checksum) {
      refuse_load(shard.data_file + ": checksum of " + name + " does not match its manifest (FNV-1a 64 " +
                  hex(checksum.value()) + " read, " + hex(shard.checksum) + " saved): the file is corrupted");
    }
    for (std::size_t a = 0; a < kArraysPerTensor; ++a) {
      arrays[a].emplace_back(bytes.begin() + static_cast<std::ptrdiff_t>(a * count),
                             bytes.begin() + static_cast<std::ptrdiff_t>((a + 1) * count));
    }
  }
  std::vector<std::vector<float>> result;
  for (const auto& array_parts : arrays) {
    result.push_back(reshard(array_parts, saved_cut, shards.front().global_shape, wanted));
  }
  return result;
}

// What a rank directory's manifest says of a tensor besides its bytes.
struct TensorEntry {
  std::string name;
  std::vector<int64_t> shape, global_shape;
  TensorCut cut;
};

// A tensor's value, first and second moment, each the shard's elements.
using TensorArrays = std::array<std::span<const float>, kArraysPerTensor>;

// Writes a rank directory: for each entry the three arrays `arrays(i)` gives (valid until the next
// call), one tensor at a time, then the manifest.
void write_rank_files(const std::string& path, const std::vector<TensorEntry>& entries,
                      const std::function<TensorArrays(std::size_t)>& arrays, int64_t tensor_parallel_rank,
                      int64_t pipeline_rank, const std::vector<int64_t>& stages) {
  std::error_code error;
  if (!std::filesystem::create_directory(path, error)) {
    throw SpecError("--save", path + ": cannot create: " + (error ? error.message() : std::string("exists")));
  }
  StagedFile data(path + "/model.bin");
  nlohmann::json tensors = nlohmann::json::array();
  uint64_t offset = 0;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const TensorEntry& entry = entries[i];
    const TensorArrays tensor = arrays(i);
    Fnv1a64 checksum;
    for (const std::span<const float> array : tensor) {
      data.write(array.data(), array.size_bytes());
      checksum.add(array.data(), array.size_bytes());
    }
    const TensorCut& cut = entry.cut;
    tensors.push_back({{"name", entry.name},
                       {"dtype", "float32"},
                       {"shape", entry.shape},
                       {"global_shape", entry.global_shape},
                       {"shard",
                        {{"dim", cut.dim < 0 ? nlohmann::json(nullptr) : nlohmann::json(cut.dim)},
                         {"index", cut.index},
                         {"count", cut.count},
                         {"chunks", cut.chunks}}},
                       {"offset", offset},
                       {"fnv1a64", hex(checksum.value())}});
    offset += kArraysPerTensor * tensor[0].size_bytes();
  }
  data.commit();
  nlohmann::json manifest = {
      {"format", kFormat},
      {"data_file", "model.bin"},
      {"layout",
       "per tensor at its offset: value, exp_avg, exp_avg_sq, each shape's elements of float32 (little endian)"},
      {"checksum", "fnv1a64: FNV-1a 64 over the tensor's three arrays' bytes"},
      {"tensor_parallel_rank", tensor_parallel_rank},
      {"pipeline_rank", pipeline_rank},
      {"stages", stages},
      {"tensors", tensors}};
  manifest["fnv1a64"] = json_checksum(manifest);
  write_file_atomically(path + "/manifest.json", manifest.dump(1) + "\n");
  sync_directory(path);
}

TensorEntry entry_of(const ParameterSpec& spec) {
  const TensorCut cut = tensor_cut(spec);
  return {spec.name, spec.shape, spec.global_shape, cut};
}

void write_rank_directory(const std::string& path, const CheckpointRank& rank,
                          const std::vector<TensorState>& moments) {
  std::vector<TensorEntry> entries;
  for (const TensorState& state : moments) entries.push_back(entry_of(*state.parameter));
  std::vector<int64_t> stages;
  for (const StageChunk* chunk : rank.chunks) stages.push_back(chunk->stage());
  std::vector<float> value;
  write_rank_files(
      path, entries,
      [&](std::size_t i) -> TensorArrays {
        const TensorState& state = moments[i];
        value.resize(state.parameter->size);
        rank.backend.download(value.data(), state.parameter->value, state.parameter->size);
        return {value, state.first_moment, state.second_moment};
      },
      rank.groups.tensor_parallel_rank, rank.groups.pipeline_rank, stages);
}

// The tokenizer as state.json holds it: train's flag names with underscores, files as absolute
// paths (convert runs from anywhere), the flags not given left out.
nlohmann::json tokenizer_json(const TokenizerOptions& tokenizer) {
  nlohmann::json json = {{"kind", tokenizer.kind}};
  const std::pair<const char*, const std::string*> files[] = {{"vocab_file", &tokenizer.vocab_file},
                                                              {"merge_file", &tokenizer.merge_file},
                                                              {"tokenizer_file", &tokenizer.tokenizer_file},
                                                              {"tokenizer_model", &tokenizer.tokenizer_model}};
  for (const auto& [key, path] : files) {
    if (path->empty()) continue;
    std::error_code error;
    const std::filesystem::path absolute = std::filesystem::absolute(*path, error);
    json[key] = error ? *path : absolute.lexically_normal().string();
  }
  return json;
}

TokenizerOptions tokenizer_from_json(const nlohmann::json& json, const std::string& source) {
  JsonFieldReader fields(json, source);
  TokenizerOptions tokenizer;
  fields.require("kind", tokenizer.kind);
  fields.read("vocab_file", tokenizer.vocab_file);
  fields.read("merge_file", tokenizer.merge_file);
  fields.read("tokenizer_file", tokenizer.tokenizer_file);
  fields.read("tokenizer_model", tokenizer.tokenizer_model);
  fields.reject_unknown_keys();
  return tokenizer;  // whether its files still read is the reader's concern (convert says so)
}

// The word embedding and the output layer: their rows are the padded vocabulary, which changes
// with tp (checkpoint.h says how a load under another padding reads them).
bool vocabulary_tensor(const std::string& name) { return name == kWordEmbeddings || name == kOutputWeight; }

// Whether a vocabulary tensor saved with `saved` global shape holds the `vocabulary` rows of one of
// `wanted` shape under another padding: the same columns, and at least the real rows.
bool other_padding(const std::vector<int64_t>& saved, const std::vector<int64_t>& wanted, int64_t vocabulary) {
  return saved.size() == 2 && wanted.size() == 2 && saved[1] == wanted[1] && saved[0] >= vocabulary &&
         wanted[0] >= vocabulary;
}

// Row-major arrays of `columns` columns given `rows` rows: the first rows kept, zero rows added.
void set_rows(std::vector<std::vector<float>>& arrays, int64_t rows, int64_t columns) {
  for (std::vector<float>& array : arrays) array.resize(static_cast<std::size_t>(rows * columns), 0.0f);
}

// state.json of a checkpoint: the training state, the model and the saving plan, its rank directories.
nlohmann::json checkpoint_meta(const TrainingState& state, const ModelSpec& model, const ParallelPlan& plan) {
  nlohmann::json directories = nlohmann::json::array();
  for (int64_t p = 0; p < plan.pipeline_parallel_size; ++p) {
    for (int64_t t = 0; t < plan.tensor_parallel_size; ++t) {
      directories.push_back(rank_directory(t, p, plan.pipeline_parallel_size));
    }
  }
  nlohmann::json meta = {{"format", kFormat},
                         {"iteration", state.iteration},
                         {"consumed_samples", state.consumed_samples},
                         {"seed", state.seed},
                         {"model", model.name},
                         {"model_spec", model_spec_to_json(model)},
                         {"plan", parallel_plan_to_json(plan)},
                         {"directories", directories}};
  if (state.tokenizer) meta["tokenizer"] = tokenizer_json(*state.tokenizer);
  if (state.skipped_iterations > 0) {
    meta["skipped_iterations"] = state.skipped_iterations;
    meta["skipped_samples"] = state.skipped_samples;
  }
  if (state.loss_scaler) {
    meta["loss_scaler"] = {{"scale", state.loss_scaler->scale},
                           {"growth_tracker", state.loss_scaler->growth_tracker},
                           {"hysteresis_tracker", state.loss_scaler->hysteresis_tracker}};
  }
  meta["fnv1a64"] = json_checksum(meta);
  return meta;
}

// Moves a complete staging directory into place as `iteration` and makes it the newest.
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

// Creates DIR (and parents) and an empty staging directory for `iteration` in it.
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

}  // namespace

void save_checkpoint(const std::string& directory, const TrainingState& state, const CheckpointRank& rank) {
  namespace fs = std::filesystem;
  const ParallelGroups& groups = rank.groups;
  const bool leader = groups.global_rank == 0;         // prepares, renames, writes "latest"
  const bool writer = groups.data_parallel_rank == 0;  // writes its mp_rank directory
  const std::string staging = directory + "/" + iteration_directory(state.iteration) + ".tmp";
  const auto barrier = [&] {
    if (groups.world) groups.world->barrier();
  };
  std::error_code error;
  try {
    if (leader) (void)create_staging(directory, state.iteration);
    barrier();  // the staging directory exists
    std::vector<TensorState> moments;
    // With the distributed optimizer every data-parallel rank takes part in gathering the moments.
    if (writer || rank.plan.use_distributed_optimizer) moments = rank.optimizer.export_state();
    if (writer) {
      write_rank_directory(
          staging + "/" +
              rank_directory(groups.tensor_parallel_rank, groups.pipeline_rank, rank.plan.pipeline_parallel_size),
          rank, moments);
    }
    if (leader) {
      write_file_atomically(staging + "/state.json", checkpoint_meta(state, rank.model, rank.plan).dump(2) + "\n");
    }
    barrier();  // every writer's files are synced
    if (leader) publish(directory, staging, state.iteration);
    barrier();  // the checkpoint is in place for every rank
  } catch (const SpecError& failure) {
    if (leader) fs::remove_all(staging, error);
    if (failure.field() == "--save") throw;
    throw SpecError("--save", failure.what());  // a staged file's failure names the file: keep it, under --save
  } catch (...) {
    if (leader) fs::remove_all(staging, error);
    throw;
  }
}

namespace {

// The newest checkpoint under a directory: its state.json, training state and every saved shard.
struct Newest {
  std::string path;  // DIR/iter_...
  nlohmann::json meta;
  TrainingState state;
  std::map<std::string, std::vector<SavedShard>> saved;  // by tensor name
};

// The iteration latest_checkpointed_iteration.txt names: decimal digits and a newline, as saved.
int64_t read_latest(const std::string& latest) {
  std::string text = read_file_contents(latest);
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (text.empty() || text.size() > kMaxIterationDigits || text.find_first_not_of("0123456789") != std::string::npos) {
    refuse_load(latest + " must hold an iteration number (up to " + std::to_string(kMaxIterationDigits) +
                " digits), and holds " +
                nlohmann::json(text.substr(0, 20)).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace));
  }
  return std::stoll(text);
}

// The newest complete iteration directory in `directory` (iter_ and digits; a .tmp staging
// directory is not one), or nullopt: a save renames its directory into place only once every
// file in it is synced, so each such directory is whole even when `latest` was never written.
std::optional<int64_t> newest_iteration_directory(const std::string& directory) {
  std::optional<int64_t> newest;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    const std::string name = entry.path().filename().string();
    const std::string digits = name.size() > 5 ? name.substr(5) : "";
    if (name.rfind("iter_", 0) != 0 || digits.empty() || digits.size() > kMaxIterationDigits ||
        digits.find_first_not_of("0123456789") != std::string::npos || !entry.is_directory(error)) {
      continue;
    }
    newest = std::max<int64_t>(newest.value_or(0), std::stoll(digits));
  }
  return newest;
}

std::optional<Newest> find_newest(const std::string& directory) {
  const std::string latest = directory + "/latest_checkpointed_iteration.txt";
  int64_t iteration = 0;
  if (std::filesystem::exists(latest)) {
    iteration = read_latest(latest);
  } else if (const std::optional<int64_t> found = newest_iteration_directory(directory)) {
    iteration = *found;  // a save killed between its rename and `latest`
  } else {
    return std::nullopt;
  }
  Newest newest;
  newest.path = directory + "/" + iteration_directory(iteration);
  const std::string& path = newest.path;
  if (!std::filesystem::is_directory(path)) {
    refuse_load(latest + " names iteration " + std::to_string(iteration) + " but " + path + " does not exist");
  }
  const std::string state_path = path + "/state.json";
  newest.meta = try_parse_json(read_file_contents(state_path)).value_or(nlohmann::json());
  const nlohmann::json& meta = newest.meta;
  if (!meta.is_object() || meta.value("format", "") != kFormat || !meta.contains("directories") ||
      !meta["directories"].is_array()) {
    const bool named = meta.is_object() && meta.contains("format");
    refuse_load(
        state_path + " is not a " + std::string(kFormat) + " checkpoint" +
        (named ? " (its format is " +
                     meta["format"].dump(-1, ' ', true, nlohmann::json::error_handler_t::replace).substr(0, 40) + ")"
               : ""));
  }
  verify_json_checksum(meta, state_path);
  TrainingState& state = newest.state;
  JsonFieldReader fields(meta, state_path);
  fields.require("iteration", state.iteration);
  fields.require("consumed_samples", state.consumed_samples);
  fields.require("seed", state.seed);
  if (state.consumed_samples < 0) {
    refuse_load(fields.field("consumed_samples") + ": must be non-negative, got " +
                std::to_string(state.consumed_samples));
  }
  if (const nlohmann::json* tokenizer = fields.read_object("tokenizer")) {
    state.tokenizer = tokenizer_from_json(*tokenizer, fields.field("tokenizer"));
  }
  fields.read("skipped_iterations", state.skipped_iterations);
  fields.read("skipped_samples", state.skipped_samples);
  if (state.skipped_iterations < 0 || state.skipped_iterations > state.iteration || state.skipped_samples < 0 ||
      state.skipped_samples > state.consumed_samples) {
    refuse_load(fields.field("skipped_iterations") + ": must lie between 0 and the iterations (and samples) done");
  }
  if (const nlohmann::json* scaler = fields.read_object("loss_scaler")) {
    JsonFieldReader scaler_fields(*scaler, fields.field("loss_scaler"));
    LossScalerState loaded;
    scaler_fields.require("scale", loaded.scale);
    scaler_fields.require("growth_tracker", loaded.growth_tracker);
    scaler_fields.require("hysteresis_tracker", loaded.hysteresis_tracker);
    scaler_fields.reject_unknown_keys();  // as the tokenizer's object beside it
    if (!(loaded.scale > 0) || !std::isfinite(loaded.scale) || loaded.growth_tracker < 0) {
      refuse_load(scaler_fields.field("scale") + ": must be a finite positive scale with a non-negative tracker");
    }
    state.loss_scaler = loaded;
  }
  if (state.iteration != iteration) {
    refuse_load(path + "/state.json says iteration " + std::to_string(state.iteration) + " but " + latest + " says " +
                std::to_string(iteration));
  }
  for (const nlohmann::json& name : meta["directories"]) {
    if (!name.is_string()) refuse_load(path + "/state.json: \"directories\" holds a non-string");
    read_manifest(path + "/" + name.get<std::string>(), newest.saved);
  }
  return newest;
}

std::optional<TrainingState> load_latest(const std::string& directory, const CheckpointRank& rank) {
  std::optional<Newest> newest = find_newest(directory);
  if (!newest) return std::nullopt;
  const std::string& path = newest->path;
  const TrainingState state = newest->state;
  // Every tensor of every saved rank directory, and the tensors the model has over all its stages.
  const std::map<std::string, std::vector<SavedShard>>& saved = newest->saved;
  const bool untied = rank.model.untie_embeddings_and_output_weights;
  const int64_t vocabulary = rank.model.vocab_size;
  // The real rows must be the model's: another vocabulary's rows are other tokens, or padding.
  if (const auto spec = newest->meta.find("model_spec"); spec != newest->meta.end() && spec->is_object()) {
    if (const auto saved_vocabulary = spec->find("vocab_size");
        saved_vocabulary != spec->end() && saved_vocabulary->is_number_integer() && *saved_vocabulary != vocabulary) {
      refuse_load(path + "/state.json: the checkpoint's vocabulary is " + saved_vocabulary->dump() +
                  " tokens, the model's " + std::to_string(vocabulary) +
                  " (a checkpoint of another vocabulary: --vocab-size " + saved_vocabulary->dump() + " trains on it)");
    }
  }
  std::map<std::string, std::vector<int64_t>> expected;  // name -> global shape
  for (int64_t stage = 0; stage < rank.plan.num_virtual_stages(); ++stage) {
    for (const ParameterSpec& spec : describe_parameters(rank.model, rank.plan, stage)) {
      // The tied output layer's copy is the word embedding's: not a tensor of its own.
      if (spec.name != kOutputWeight || untied) expected[spec.name] = spec.global_shape;
    }
  }
  for (const auto& [name, shards] : saved) {
    // The tied output layer's copy has the word embedding's shape; a layout without one ignores it.
    const auto found = expected.find(name == kOutputWeight && !untied ? kWordEmbeddings : name);
    if (found == expected.end()) {
      refuse_load(shards.front().manifest + ": the checkpoint holds " + name + ", which " + rank.model.name +
                  " does not have (a checkpoint of another model)");
    }
    const std::vector<int64_t>& saved_shape = shards.front().global_shape;
    if (saved_shape != found->second &&
        !(vocabulary_tensor(name) && other_padding(saved_shape, found->second, vocabulary))) {
      refuse_load(shards.front().manifest + ": " + name + " has global shape " + shape_text(saved_shape) +
                  " in the checkpoint but " + shape_text(found->second) + " in the model");
    }
    for (const SavedShard& shard : shards) {
      if (shard.global_shape != shards.front().global_shape) {
        refuse_load(shard.manifest + ": " + name + " has global shape " + shape_text(shard.global_shape) +
                    " here but " + shape_text(shards.front().global_shape) + " in " + shards.front().manifest);
      }
    }
  }
  for (const auto& [name, shape] : expected) {
    if (!saved.count(name)) {
      refuse_load(path + " holds no " + name + ", which the model needs (a checkpoint of another model)");
    }
  }

  // This rank's tensors: values straight into the chunks, moments through the optimizer.
  std::map<std::string, std::ifstream> files;
  std::vector<TensorState> moments;
  for (StageChunk* chunk : rank.chunks) {
    for (const Parameter& parameter : chunk->parameters()) {
      const std::string source =
          parameter.name == kOutputWeight && !untied && !saved.count(parameter.name) ? kWordEmbeddings : parameter.name;
      const std::vector<SavedShard>& shards = saved.at(source);
      const std::vector<int64_t>& saved_shape = shards.front().global_shape;
      std::vector<std::vector<float>> arrays;
      if (saved_shape == parameter.global_shape) {
        arrays = read_tensor(source, shards, tensor_cut(parameter), files);
      } else {
        // The vocabulary under another padding: the whole tensor with this layout's rows, then this
        // rank's part of it.
        arrays = read_tensor(source, shards, TensorCut{}, files);
        set_rows(arrays, parameter.global_shape[0], parameter.global_shape[1]);
        for (std::vector<float>& array : arrays) {
          array = reshard({array}, TensorCut{}, parameter.global_shape, tensor_cut(parameter));
        }
      }
      if (arrays[0].size() != parameter.size) {
        throw std::logic_error("checkpoint: " + parameter.name + "'s part holds " + std::to_string(arrays[0].size()) +
                               " elements, the parameter " + std::to_string(parameter.size));
      }
      rank.backend.upload(parameter.value, arrays[0].data(), parameter.size);
      moments.push_back({&parameter, std::move(arrays[1]), std::move(arrays[2])});
    }
  }
  rank.optimizer.import_state(moments);
  for (StageChunk* chunk : rank.chunks) chunk->refresh_compute_weights();

  return state;
}

}  // namespace

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

std::optional<TrainingState> load_checkpoint(const std::string& directory, const CheckpointRank& rank) {
  try {
    return load_latest(directory, rank);
  } catch (const SpecError& failure) {
    if (failure.field() == "--load") throw;
    throw SpecError("--load", failure.what());  // an unreadable file names itself: keep it, under --load
  }
}

CheckpointWeights read_checkpoint_weights(const std::string& directory) {
  try {
    std::optional<Newest> newest = find_newest(directory);
    if (!newest) refuse_load(directory + " holds no checkpoint (no latest_checkpointed_iteration.txt)");
    CheckpointWeights weights;
    if (!newest->meta.contains("model_spec")) {
      refuse_load(newest->path + "/state.json names no model_spec (a checkpoint saved before megaplan recorded it)");
    }
    weights.model = model_spec_from_json(newest->meta["model_spec"], newest->path + "/state.json: model_spec");
    validate_model_spec(weights.model);
    weights.tokenizer = newest->state.tokenizer;
    std::map<std::string, std::ifstream> files;
    for (const auto& [name, shards] : newest->saved) {
      // A tied output layer's copy is the word embedding: left out.
      if (name == kOutputWeight && !weights.model.untie_embeddings_and_output_weights) continue;
      std::vector<std::vector<float>> arrays = read_tensor(name, shards, TensorCut{}, files);
      std::vector<int64_t> shape = shards.front().global_shape;
      if (vocabulary_tensor(name)) {
        // The true vocabulary's rows; the rest were the saving layout's padding.
        if (shape.size() != 2 || shape[0] < weights.model.vocab_size) {
          refuse_load(shards.front().manifest + ": " + name + " has global shape " + shape_text(shape) +
                      ", fewer rows than " + "the vocabulary of " + std::to_string(weights.model.vocab_size) +
                      " state.json records");
        }
        shape[0] = weights.model.vocab_size;
        set_rows(arrays, shape[0], shape[1]);
      }
      weights.tensors[name] = {shape, std::move(arrays[0])};
    }
    return weights;
  } catch (const SpecError& failure) {
    if (failure.field() == "--load") throw;
    throw SpecError("--load", failure.what());
  }
}

void write_checkpoint_weights(const std::string& directory, const ModelSpec& model, const ParallelPlan& plan,
                              const std::map<std::string, WholeTensor>& tensors, uint64_t seed) {
  TrainingState state;  // weights from elsewhere: iteration 0, no tokenizer known
  state.seed = seed;
  const std::string staging = create_staging(directory, state.iteration);
  try {
    for (int64_t p = 0; p < plan.pipeline_parallel_size; ++p) {
      for (int64_t t = 0; t < plan.tensor_parallel_size; ++t) {
        std::vector<ParameterSpec> specs;
        const std::vector<int64_t> stages = stages_of_pipeline_rank(p, plan);
        for (const int64_t stage : stages) {
          for (ParameterSpec& spec : describe_parameters(model, plan, stage, t)) specs.push_back(std::move(spec));
        }
        std::vector<TensorEntry> entries;
        for (const ParameterSpec& spec : specs) entries.push_back(entry_of(spec));
        std::vector<float> value, zeros;
        write_rank_files(
            staging + "/" + rank_directory(t, p, plan.pipeline_parallel_size), entries,
            [&](std::size_t i) -> TensorArrays {
              const ParameterSpec& spec = specs[i];
              // A tied output layer's copy starts as the word embedding, as training makes it.
              const bool copy = spec.name == kOutputWeight && !model.untie_embeddings_and_output_weights;
              const auto found = tensors.find(copy ? std::string(kWordEmbeddings) : spec.name);
              if (found == tensors.end()) throw std::logic_error("write_checkpoint_weights: no tensor " + spec.name);
              const WholeTensor& whole = found->second;
              // The vocabulary's rows padded to the layout's (Megatron's padding), with zeros.
              const bool vocabulary = copy || spec.name == kWordEmbeddings || spec.name == kOutputWeight;
              const bool padded = vocabulary && whole.shape.size() == 2 && whole.shape[0] < spec.global_shape[0] &&
                                  whole.shape[1] == spec.global_shape[1];
              if (!padded && whole.shape != spec.global_shape) {
                throw SpecError("--save", spec.name + " has shape " + shape_text(whole.shape) + ", the model " +
                                              shape_text(spec.global_shape));
              }
              std::vector<std::vector<float>> parts(1, whole.values);
              if (padded) parts[0].resize(elements(spec.global_shape), 0.0f);
              value = reshard(parts, TensorCut{}, spec.global_shape, tensor_cut(spec));
              zeros.assign(value.size(), 0.0f);  // a fresh optimizer's moments
              return {value, zeros, zeros};
            },
            t, p, stages);
      }
    }
    write_file_atomically(staging + "/state.json", checkpoint_meta(state, model, plan).dump(2) + "\n");
    publish(directory, staging, state.iteration);
  } catch (...) {
    std::error_code error;
    std::filesystem::remove_all(staging, error);
    throw;
  }
}

}  // namespace megaplan::exec
