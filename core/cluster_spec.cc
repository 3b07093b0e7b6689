// ClusterSpec validation, GPU selection and JSON mapping.
#include "core/cluster_spec.h"

#include <nlohmann/json.hpp>

#include <cmath>

#include "core/checked_math.h"
#include "core/input_limits.h"
#include "core/json_io.h"

namespace megaplan {

namespace {

// A rate below one unit per second, or infinite, makes every time it divides meaningless.
void require_positive_rate(double value, const std::string& field) {
  if (!(value >= 1) || !std::isfinite(value)) {
    throw SpecError(field, "must be a finite number of at least 1 per second, got " + nlohmann::json(value).dump());
  }
}

// Link latencies: a second is already a thousand times any network's.
void require_latency(double value, const std::string& field) {
  if (!(value >= 0) || !(value <= 1)) {
    throw SpecError(field, "must be between 0 and 1 second, got " + nlohmann::json(value).dump());
  }
}

}  // namespace

void validate_cluster_spec(const ClusterSpec& cluster) {
  require_positive(cluster.num_nodes, "num_nodes");
  require_positive(cluster.gpus_per_node, "gpus_per_node");
  require_at_most(cluster.gpus_per_node, kMaxGpusPerNode, "gpus_per_node");
  require_at_most(checked_multiply(cluster.num_nodes, cluster.gpus_per_node, "num_nodes"), kMaxWorldSize,
                  "num_nodes x gpus_per_node");
  require_positive_rate(cluster.gpu.dense_bf16_flops_per_s, "gpu.dense_bf16_flops_per_s");
  require_positive_rate(cluster.gpu.dense_fp16_flops_per_s, "gpu.dense_fp16_flops_per_s");
  require_positive(cluster.gpu.hbm_capacity_bytes, "gpu.hbm_capacity_bytes");
  require_positive_rate(cluster.gpu.hbm_bandwidth_bytes_per_s, "gpu.hbm_bandwidth_bytes_per_s");
  if (cluster.gpu.streaming_multiprocessors < 0) {
    throw SpecError("gpu.streaming_multiprocessors",
                    "must not be negative, got " + std::to_string(cluster.gpu.streaming_multiprocessors));
  }
  require_latency(cluster.intra_node.latency_s, "intra_node.latency_s");
  require_latency(cluster.inter_node.latency_s, "inter_node.latency_s");
  if (cluster.inter_node.nics_per_node < 0) {
    throw SpecError("inter_node.nics_per_node",
                    "must not be negative, got " + std::to_string(cluster.inter_node.nics_per_node));
  }
  require_at_most(cluster.inter_node.nics_per_node, kMaxNicsPerNode, "inter_node.nics_per_node");
  // GPUs that share a node must be able to talk; nodes must be able to talk to each other.
  if (cluster.gpus_per_node > 1) {
    require_positive_rate(cluster.intra_node.bandwidth_per_gpu_bytes_per_s,
                          "intra_node.bandwidth_per_gpu_bytes_per_s (more than one GPU per node)");
  }
  if (cluster.num_nodes > 1) {
    if (cluster.inter_node.nics_per_node <= 0) {
      throw SpecError("inter_node.nics_per_node", "must be positive when num_nodes > 1");
    }
    require_positive_rate(cluster.inter_node.bandwidth_per_nic_bytes_per_s,
                          "inter_node.bandwidth_per_nic_bytes_per_s (num_nodes > 1)");
  }
}

ClusterSpec select_gpus(const ClusterSpec& cluster, int64_t gpus) {
  require_positive(gpus, "--gpus");
  if (gpus > cluster.total_gpus()) {
    throw SpecError("--gpus", std::to_string(gpus) + " GPUs exceed cluster " + cluster.name + " (" +
                                  std::to_string(cluster.num_nodes) + " nodes x " +
                                  std::to_string(cluster.gpus_per_node) + " = " + std::to_string(cluster.total_gpus()) +
                                  " GPUs)");
  }
  ClusterSpec selected = cluster;
  if (gpus >= cluster.gpus_per_node) {
    if (gpus % cluster.gpus_per_node != 0) {
      throw SpecError("--gpus", "must be a multiple of a node (" + std::to_string(cluster.gpus_per_node) +
                                    " GPUs) or less than one node, got " + std::to_string(gpus));
    }
    selected.num_nodes = gpus / cluster.gpus_per_node;
  } else {
    selected.num_nodes = 1;
    selected.gpus_per_node = gpus;
  }
  return selected;
}

ClusterSpec load_cluster_spec(const std::string& name_or_path) {
  if (!name_or_path.ends_with(".json")) return cluster_preset(name_or_path);
  ClusterSpec cluster = cluster_spec_from_json(read_json_file(name_or_path), name_or_path);
  validate_cluster_spec(cluster);
  return cluster;
}

nlohmann::json cluster_spec_to_json(const ClusterSpec& cluster) {
  return nlohmann::json{
      {"name", cluster.name},
      {"num_nodes", cluster.num_nodes},
      {"gpus_per_node", cluster.gpus_per_node},
      {"gpu",
       {{"name", cluster.gpu.name},
        {"dense_bf16_flops_per_s", cluster.gpu.dense_bf16_flops_per_s},
        {"dense_fp16_flops_per_s", cluster.gpu.dense_fp16_flops_per_s},
        {"hbm_capacity_bytes", cluster.gpu.hbm_capacity_bytes},
        {"hbm_bandwidth_bytes_per_s", cluster.gpu.hbm_bandwidth_bytes_per_s},
        {"streaming_multiprocessors", cluster.gpu.streaming_multiprocessors}}},
      {"intra_node",
       {{"kind", cluster.intra_node.kind},
        {"bandwidth_per_gpu_bytes_per_s", cluster.intra_node.bandwidth_per_gpu_bytes_per_s},
        {"latency_s", cluster.intra_node.latency_s}}},
      {"inter_node",
       {{"kind", cluster.inter_node.kind},
        {"nics_per_node", cluster.inter_node.nics_per_node},
        {"bandwidth_per_nic_bytes_per_s", cluster.inter_node.bandwidth_per_nic_bytes_per_s},
        {"latency_s", cluster.inter_node.latency_s}}},
      {"source", cluster.source},
  };
}

ClusterSpec cluster_spec_from_json(const nlohmann::json& json, const std::string& source) {
  JsonFieldReader reader(json, source);
  ClusterSpec cluster;
  cluster.name = source;
  reader.read("name", cluster.name);
  reader.require("num_nodes", cluster.num_nodes);
  reader.require("gpus_per_node", cluster.gpus_per_node);
  reader.read("source", cluster.source);

  const nlohmann::json* gpu = reader.read_object("gpu");
  if (gpu == nullptr) throw SpecError(reader.field("gpu"), "required field is missing");
  JsonFieldReader gpu_reader(*gpu, source + ": gpu");
  gpu_reader.read("name", cluster.gpu.name);
  gpu_reader.require("dense_bf16_flops_per_s", cluster.gpu.dense_bf16_flops_per_s);
  cluster.gpu.dense_fp16_flops_per_s = cluster.gpu.dense_bf16_flops_per_s;
  gpu_reader.read("dense_fp16_flops_per_s", cluster.gpu.dense_fp16_flops_per_s);
  gpu_reader.require("hbm_capacity_bytes", cluster.gpu.hbm_capacity_bytes);
  gpu_reader.require("hbm_bandwidth_bytes_per_s", cluster.gpu.hbm_bandwidth_bytes_per_s);
  gpu_reader.read("streaming_multiprocessors", cluster.gpu.streaming_multiprocessors);
  gpu_reader.reject_unknown_keys();

  if (const nlohmann::json* intra = reader.read_object("intra_node")) {
    JsonFieldReader intra_reader(*intra, source + ": intra_node");
    intra_reader.read("kind", cluster.intra_node.kind);
    intra_reader.read("bandwidth_per_gpu_bytes_per_s", cluster.intra_node.bandwidth_per_gpu_bytes_per_s);
    intra_reader.read("latency_s", cluster.intra_node.latency_s);
    intra_reader.reject_unknown_keys();
  }
  if (const nlohmann::json* inter = reader.read_object("inter_node")) {
    JsonFieldReader inter_reader(*inter, source + ": inter_node");
    inter_reader.read("kind", cluster.inter_node.kind);
    inter_reader.read("nics_per_node", cluster.inter_node.nics_per_node);
    inter_reader.read("bandwidth_per_nic_bytes_per_s", cluster.inter_node.bandwidth_per_nic_bytes_per_s);
    inter_reader.read("latency_s", cluster.inter_node.latency_s);
    inter_reader.reject_unknown_keys();
  }
  reader.reject_unknown_keys();
  return cluster;
}

}  // namespace megaplan
