#include "executor/train/checkpoint_manifest.h"

#include <algorithm>
#include <filesystem>
#include <optional>

#include "core/json_io.h"
#include "core/text_file.h"
#include "executor/model/stage_chunk.h"
#include "executor/train/checkpoint_format.h"

namespace megaplan::exec::checkpoint_format {

uint64_t TensorEntry::bytes() const { return kArraysPerTensor * elements(shape) * sizeof(float); }

TensorEntry entry_of(const ParameterSpec& spec) { return {spec.name, spec.shape, spec.global_shape, tensor_cut(spec)}; }

void RankLayout::lay_out(std::vector<TensorEntry> laid_out) {
  entries = std::move(laid_out);
  offsets.clear();
  total_bytes = 0;
  for (const TensorEntry& entry : entries) {
    offsets.push_back(total_bytes);
    total_bytes += entry.bytes();
  }
}

nlohmann::json rank_manifest(const RankLayout& layout, const std::vector<std::vector<uint64_t>>& block_checksums) {
  nlohmann::json tensors = nlohmann::json::array();
  for (std::size_t i = 0; i < layout.entries.size(); ++i) {
    const TensorEntry& entry = layout.entries[i];
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
                       {"offset", layout.offsets[i]},
                       {kXxh3Checksum, hex(combine_block_checksums(block_checksums[i]))}});
  }
  nlohmann::json manifest = {
      {"format", kFormat},
      {"data_file", "model.bin"},
      {"layout",
       "per tensor at its offset: value, exp_avg, exp_avg_sq, each shape's elements of float32 (little endian)"},
      {"checksum",
       "xxh3_64: XXH3-64 over the XXH3-64s (little-endian words) of the tensor's bytes' blocks of "
       "checksum_block_bytes (the last one shorter)"},
      {"tensor_checksum", kXxh3Checksum},
      {"checksum_block_bytes", kChecksumBlockBytes},
      {"iteration", layout.binding.iteration},
      {"directory", layout.binding.directory},
      {"plan", layout.binding.plan},
      {"tensor_parallel_rank", layout.tensor_parallel_rank},
      {"pipeline_rank", layout.pipeline_rank},
      {"stages", layout.stages},
      {"tensors", tensors}};
  manifest["fnv1a64"] = json_checksum(manifest);
  return manifest;
}

namespace {

// Format 4's binding: the manifest's iteration, directory and saving plan must be the checkpoint's.
void check_binding(JsonFieldReader& fields, const RankBinding& expected, const std::string& iteration_path) {
  int64_t iteration = 0;
  std::string directory;
  fields.require("iteration", iteration);
  fields.require("directory", directory);
  const nlohmann::json* plan = fields.read_object("plan");
  const std::string foreign = " (a rank directory of another checkpoint: copied or moved)";
  if (iteration != expected.iteration) {
    refuse_load(fields.field("iteration") + ": saved at iteration " + std::to_string(iteration) + ", but " +
                iteration_path + " is iteration " + std::to_string(expected.iteration) + foreign);
  }
  if (directory != expected.directory) {
    refuse_load(fields.field("directory") + ": saved as " + nlohmann::json(directory.substr(0, 40)).dump() +
                ", but it lies in " + expected.directory + foreign);
  }
  if (!plan || *plan != expected.plan) {
    refuse_load(fields.field("plan") + ": saved under another plan than state.json's" + foreign);
  }
}

}  // namespace

uint64_t SavedShard::bytes() const { return kArraysPerTensor * elements(shape) * sizeof(float); }

void read_manifest(const std::string& iteration_path, const RankBinding& expected,
                   std::map<std::string, std::vector<SavedShard>>& saved) {
  const std::string rank_path = iteration_path + "/" + expected.directory;
  const std::string path = rank_path + "/manifest.json";
  if (!checkpoint_path_exists(path)) refuse_load(path + ": missing (the checkpoint is incomplete)");
  const std::optional<nlohmann::json> manifest = try_parse_json(read_checkpoint_json_text(path));
  if (!manifest || !manifest->is_object() || !known_format(manifest->value("format", "")) ||
      !manifest->contains("tensors") || !(*manifest)["tensors"].is_array()) {
    refuse_load(path + ": not a " + std::string(kFormat) + " manifest");
  }
  verify_json_checksum(*manifest, path);
  // Format 2 names no algorithm: FNV-1a 64 over each tensor.
  JsonFieldReader manifest_fields(*manifest, path);
  if ((*manifest)["format"] == kFormat) check_binding(manifest_fields, expected, iteration_path);
  std::string algorithm = kFnvChecksum;
  uint64_t block_bytes = 0;
  if ((*manifest)["format"] != kFnvFormat) {
    manifest_fields.require("tensor_checksum", algorithm);
    if (algorithm != kXxh3Checksum && algorithm != kFnvChecksum) {
      refuse_load(manifest_fields.field("tensor_checksum") + ": must be \"" + kXxh3Checksum + "\" or \"" +
                  kFnvChecksum + "\", got \"" + algorithm.substr(0, 40) + "\"");
    }
    if (algorithm == kXxh3Checksum) {
      manifest_fields.require("checksum_block_bytes", block_bytes);
      if (block_bytes == 0 || block_bytes > kMaxTensorElements) {
        refuse_load(manifest_fields.field("checksum_block_bytes") + ": must be a positive size up to " +
                    std::to_string(kMaxTensorElements) + " bytes, got " + std::to_string(block_bytes));
      }
    }
  }
  std::string data_file = "model.bin";
  if (const auto found = manifest->find("data_file"); found != manifest->end()) {
    if (!found->is_string() || found->get<std::string>().find('/') != std::string::npos) {
      refuse_load(path + ": data_file must name a file in its directory");
    }
    data_file = found->get<std::string>();
  }
  int64_t saving_tensor_parallel_rank = 0;
  manifest_fields.read("tensor_parallel_rank", saving_tensor_parallel_rank);
  int64_t entry_index = 0;
  uint64_t data_bytes = 0;  // the end of the last tensor: model.bin's size, as saves lay it out
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
    fields.require(algorithm, checksum);
    if (checksum.size() != 16 || checksum.find_first_not_of("0123456789abcdef") != std::string::npos) {
      refuse_load(fields.field(algorithm) + ": must be 16 hexadecimal digits, got \"" + checksum + "\"");
    }
    shard.checksum = std::stoull(checksum, nullptr, 16);
    shard.algorithm = algorithm;
    shard.block_bytes = block_bytes;
    const TensorCut& cut = shard.cut;
    if (!cut_fits(shard.global_shape, cut) || shard.shape != part_shape(shard.global_shape, cut)) {
      refuse_load(path + ": " + name + " has shape " + shape_text(shard.shape) + ", which is not part " +
                  std::to_string(cut.index) + " of " + std::to_string(cut.count) + " along dimension " +
                  std::to_string(cut.dim) + " of its global shape " + shape_text(shard.global_shape));
    }
    shard.name = name;
    shard.tensor_parallel_rank = saving_tensor_parallel_rank;
    data_bytes = std::max(data_bytes, shard.offset + shard.bytes());
    saved[name].push_back(std::move(shard));
  }
  // Bytes past the tensors, or missing: not the file the manifest describes (a shorter one also
  // fails its read; a longer one would load).
  if (entry_index > 0) {
    std::error_code error;
    const std::string data_path = rank_path + "/" + data_file;
    require_regular_file(data_path, "--load");
    const uintmax_t size = std::filesystem::file_size(data_path, error);
    if (error) refuse_load(data_path + ": cannot read: " + error.message());
    if (size != data_bytes) {
      refuse_load(data_path + " holds " + std::to_string(size) + " bytes, its manifest's tensors " +
                  std::to_string(data_bytes) + " (a damaged or foreign model.bin)");
    }
  }
}

}  // namespace megaplan::exec::checkpoint_format
