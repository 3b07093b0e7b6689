// fuzz_seeds OUT: writes the seeds that megaplan's own writers make into OUT/<target>/, so that
// they follow the formats as the code changes: indexed datasets and safetensors files (binary),
// the tiny checkpoint's state.json and manifest.json, the presets as model, cluster and job files,
// and a shipped measured profile cut to a few entries per table. The source tree's example files
// join them at build time (CMakeLists.txt).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/cluster_spec.h"
#include "core/job_spec.h"
#include "core/model_presets.h"
#include "core/text_file.h"
#include "executor/data/gpt_dataset.h"
#include "executor/data/indexed_dataset.h"
#include "executor/io/safetensors.h"
#include "simulator/builtin_profiles.h"
#include "simulator/profile.h"
#include "simulator/profile_transfer.h"
#include "tests/fuzz/fuzz_support.h"
#include "tests/fuzz/tiny_checkpoint.h"

namespace {

using megaplan::fuzz::require;
using megaplan::fuzz::scratch_directory;
namespace exec = megaplan::exec;

std::string out;

void seed(const std::string& target, const std::string& name, const std::string& bytes) {
  std::filesystem::create_directories(out + "/" + target);
  megaplan::fuzz::write_file(out + "/" + target + "/" + name, bytes);
}

void specs() {
  for (const megaplan::ModelPreset& preset : megaplan::model_presets()) {
    seed("model_json", preset.spec.name + ".json", megaplan::model_spec_to_json(preset.spec).dump(2));
  }
  for (const megaplan::ClusterSpec& cluster : megaplan::cluster_presets()) {
    seed("cluster_json", cluster.name + ".json", megaplan::cluster_spec_to_json(cluster).dump(2));
  }
}

// A job per plan shape below that the first GPT-style and the first SwiGLU preset pass, on the
// first 8-GPU node preset: single GPU, interleaved with every memory option, zero bubble V, DualPipeV.
void jobs() {
  const std::vector<megaplan::ModelPreset>& presets = megaplan::model_presets();
  const auto first = [&](bool swiglu) {
    for (const megaplan::ModelPreset& preset : presets) {
      if (preset.spec.swiglu == swiglu) return preset.spec;
    }
    return presets.front().spec;
  };
  const std::vector<megaplan::ClusterSpec>& clusters = megaplan::cluster_presets();
  const auto node = std::find_if(clusters.begin(), clusters.end(), [](const auto& c) { return c.gpus_per_node == 8; });
  require(node != clusters.end(), "no 8-GPU node preset");
  struct Shape {
    int64_t gpus, tp, pp, vpp;
    megaplan::ScheduleKind schedule;
    bool memory_options;
  };
  const std::vector<Shape> shapes = {{1, 1, 1, 1, megaplan::ScheduleKind::kOneFOneB, false},
                                     {8, 2, 2, 2, megaplan::ScheduleKind::kInterleaved, true},
                                     {8, 1, 2, 2, megaplan::ScheduleKind::kZeroBubbleV, false},
                                     {16, 2, 2, 2, megaplan::ScheduleKind::kDualPipeV, true}};
  int written = 0;
  for (const megaplan::ModelSpec& model : {first(false), first(true)}) {
    for (const Shape& shape : shapes) {
      megaplan::JobSpec job{model, {}, {}};
      megaplan::ParallelPlan& plan = job.plan;
      plan.tensor_parallel_size = shape.tp;
      plan.pipeline_parallel_size = shape.pp;
      plan.virtual_pipeline_parallel_size = shape.vpp;
      plan.data_parallel_size = shape.gpus / (shape.tp * shape.pp);
      plan.schedule = shape.schedule;
      plan.micro_batch_size = 1;
      plan.global_batch_size = 8 * plan.data_parallel_size;
      plan.sequence_parallel = shape.memory_options && shape.tp > 1;
      plan.use_distributed_optimizer = shape.memory_options;
      if (shape.memory_options) plan.recompute_granularity = megaplan::RecomputeGranularity::kSelective;
      try {
        job.cluster = megaplan::select_gpus(*node, shape.gpus);
        megaplan::validate_job(job);
      } catch (const megaplan::SpecError& refused) {
        std::fprintf(stderr, "fuzz_seeds: no job seed for %s, %s: %s\n", model.name.c_str(),
                     megaplan::describe_plan(plan).c_str(), refused.what());
        continue;
      }
      seed("job_json", "job-" + std::to_string(written++) + ".json", megaplan::job_spec_to_json(job).dump(2));
    }
  }
  require(written > 0, "no job seed passes validate_job");
}

// The first shipped measured profile, each table cut to its first entries, with the tables no
// shipped profile measures (collectives, p2p, overlap) added; and the same carried to another GPU.
void profiles() {
  for (const megaplan::ClusterSpec& cluster : megaplan::cluster_presets()) {
    const std::optional<megaplan::sim::BuiltinProfileFile> file =
        megaplan::sim::builtin_measured_profile_file(cluster.gpu.name);
    if (!file) continue;
    nlohmann::json profile = file->json;
    for (auto& [key, value] : profile.items()) {
      if (value.is_array() && value.size() > 4) value.erase(value.begin() + 4, value.end());
    }
    profile["collectives"] = nlohmann::json::parse(R"([
      {"op": "all_reduce", "group_size": 8, "link": "nvlink", "bytes": 1048576, "bus_bandwidth_bytes_per_s": 1.2e11},
      {"op": "all_reduce", "group_size": 8, "link": "nvlink", "bytes": 268435456, "bus_bandwidth_bytes_per_s": 3.6e11},
      {"op": "all_gather", "group_size": 16, "link": "network", "bytes": 268435456, "bus_bandwidth_bytes_per_s": 4.0e10}])");
    profile["p2p"] = nlohmann::json::parse(R"([
      {"link": "nvlink", "bytes": 1048576, "seconds": 2.5e-5},
      {"link": "network", "bytes": 1048576, "seconds": 6e-5}])");
    profile["overlap"] = nlohmann::json::parse(R"([
      {"op": "all_reduce", "group_size": 8, "link": "nvlink", "compute_slowdown": 0.12},
      {"op": "send_recv", "group_size": 2, "link": "network", "compute_slowdown": 0.02}])");
    (void)megaplan::sim::Profile::from_json(profile, "seed");  // a refused seed is a stale seed
    seed("profile_json", "measured.json", profile.dump(1));
    for (const megaplan::ClusterSpec& other : megaplan::cluster_presets()) {
      if (other.gpu.name == cluster.gpu.name) continue;
      const nlohmann::json transferred = megaplan::sim::transfer_profile(profile, "seed", cluster.gpu, other.gpu);
      (void)megaplan::sim::Profile::from_json(transferred, "seed");
      seed("profile_json", "transferred.json", transferred.dump(1));
      return;
    }
    return;
  }
  require(false, "no shipped measured profile");
}

// Each dataset as its .idx then its .bin (fuzz_indexed_dataset.cc splits them again).
void datasets() {
  const std::vector<std::pair<exec::TokenType, std::vector<std::vector<int64_t>>>> datasets = {
      {exec::TokenType::kUint16, {{1, 2, 3}, {}, {65000, 7}}},
      {exec::TokenType::kInt32, {{100000, -5}, {3}}},
      {exec::TokenType::kUint8, {{0, 255, 17}}},
      {exec::TokenType::kInt64, {{int64_t{1} << 40}, {2, 3}}},
      {exec::TokenType::kFloat32, {{1, 2, 3}, {4}}},
  };
  for (const auto& [type, documents] : datasets) {
    // A prefix of its own: megaplan's writers refuse to replace a file this process has read.
    const std::string prefix = scratch_directory() + "/dataset-" + std::to_string(static_cast<int>(type));
    exec::IndexedDatasetWriter writer(prefix, type);
    for (const std::vector<int64_t>& document : documents) writer.add_document(document);
    writer.finish();
    seed("indexed_dataset", "dtype-" + std::to_string(static_cast<int>(type)),
         megaplan::read_text_file(prefix + ".idx") + megaplan::read_text_file(prefix + ".bin"));
  }
}

// A training split's sample index, as a run caches it, built from the first seed dataset.
void sample_index() {
  const std::string prefix =
      scratch_directory() + "/dataset-" + std::to_string(static_cast<int>(exec::TokenType::kUint16));
  const exec::IndexedDataset dataset(prefix);
  const std::string folder = scratch_directory() + "/indexes";
  const exec::GptSamples samples(dataset, exec::GptSampleSpec{{0, 3}, "train", 2, 20, 1234},
                                 exec::IndexCache{folder, 1, nullptr});
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    seed("sample_index", "train", megaplan::read_text_file(entry.path().string()));
  }
}

void safetensors() {
  const std::map<std::string, exec::WholeTensor> tensors = {
      {"embedding.weight", {{4, 3}, {0, 1, -2, 3.5f, 1e-3f, 65504, -0.0f, 7, 8, 9, 10, 11}}},
      {"norm.bias", {{3}, {0.5f, 0.25f, -1}}},
  };
  for (const exec::SafetensorsDtype dtype : {exec::SafetensorsDtype::kF32, exec::SafetensorsDtype::kBF16}) {
    const std::string path = scratch_directory() + "/" + exec::safetensors_dtype_name(dtype) + ".safetensors";
    exec::write_safetensors(path, tensors, dtype, {{"format", "pt"}}, "seed");
    seed("safetensors", exec::safetensors_dtype_name(dtype), megaplan::read_text_file(path));
  }
}

// state.json as saved, and without its checksum (as before megaplan wrote one), so that mutations
// of its fields are read rather than refused by the checksum; rank 0's manifest likewise, and as
// format 2 wrote it (FNV-1a 64 per tensor, no algorithm named).
void checkpoint() {
  const std::string iteration = megaplan::fuzz::write_tiny_checkpoint(scratch_directory() + "/checkpoint");
  const std::string state = megaplan::read_text_file(iteration + "/state.json");
  seed("checkpoint_state", "state.json", state);
  nlohmann::json unsummed = nlohmann::json::parse(state);
  unsummed.erase("fnv1a64");
  seed("checkpoint_state", "state-without-checksum.json", unsummed.dump(2));
  const std::string manifest = megaplan::read_text_file(iteration + "/mp_rank_00/manifest.json");
  seed("checkpoint_manifest", "manifest.json", manifest);
  nlohmann::json unsummed_manifest = nlohmann::json::parse(manifest);
  unsummed_manifest.erase("fnv1a64");
  seed("checkpoint_manifest", "manifest-without-checksum.json", unsummed_manifest.dump(1));
  nlohmann::json format_2 = unsummed_manifest;
  format_2["format"] = "megaplan-checkpoint/2";
  format_2.erase("tensor_checksum");
  format_2.erase("checksum_block_bytes");
  for (nlohmann::json& tensor : format_2["tensors"]) {
    tensor["fnv1a64"] = tensor["xxh3_64"];
    tensor.erase("xxh3_64");
  }
  seed("checkpoint_manifest", "manifest-format-2.json", format_2.dump(1));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds OUT\n");
    return 2;
  }
  out = argv[1];
  specs();
  jobs();
  profiles();
  datasets();
  sample_index();
  safetensors();
  checkpoint();
  return 0;
}
