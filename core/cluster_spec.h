// ClusterSpec: what a cluster offers a training job, from vendor datasheets: the GPU, the fabric
// inside a node (NVLink/NVSwitch) and the network between nodes (NICs). The simulator turns this
// into a topology graph; the planner reads capacities from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace megaplan {

struct GpuSpec {
  std::string name;                   // "H100-SXM5-80GB"
  double dense_bf16_flops_per_s = 0;  // tensor-core peak without sparsity
  double dense_fp16_flops_per_s = 0;
  int64_t hbm_capacity_bytes = 0;  // datasheet capacity, decimal GB
  double hbm_bandwidth_bytes_per_s = 0;
  int64_t streaming_multiprocessors = 0;  // SMs; 0 where unknown (wave quantisation then unmodelled)
};

// Intra-node fabric. Bandwidths are per GPU and per direction; datasheets quote the
// bidirectional sum (A100: "600 GB/s"), which is twice this number.
struct IntraNodeFabric {
  std::string kind;  // "NVSwitch", "NVLink", "PCIe"
  double bandwidth_per_gpu_bytes_per_s = 0;
  double latency_s = 0;
};

// Inter-node network: NICs per node, each with its own per-direction line rate.
struct InterNodeNetwork {
  std::string kind;           // "InfiniBand NDR"
  int64_t nics_per_node = 0;  // 0 for single-node machines
  double bandwidth_per_nic_bytes_per_s = 0;
  double latency_s = 0;
};

struct ClusterSpec {
  std::string name;
  int64_t num_nodes = 0;
  int64_t gpus_per_node = 0;
  GpuSpec gpu;
  IntraNodeFabric intra_node;
  InterNodeNetwork inter_node;
  std::string source;  // where the numbers come from (datasheet citations)

  int64_t total_gpus() const { return num_nodes * gpus_per_node; }
};

// Throws SpecError naming the JSON field and the rule.
void validate_cluster_spec(const ClusterSpec& cluster);

// The cluster restricted to the first `gpus` GPUs: a whole number of nodes, or part of one node.
// Throws SpecError("--gpus", ...) when gpus exceeds the cluster or splits a node unevenly.
ClusterSpec select_gpus(const ClusterSpec& cluster, int64_t gpus);

// Presets with cited datasheet numbers (dgx-a100-80gb, dgx-h100, dgx-h200, h100-x1, h200-x1,
// h200-x2). A preset is a cluster of `num_nodes` nodes; `--gpus` selects how many to use.
const std::vector<ClusterSpec>& cluster_presets();
// Throws SpecError("--cluster", ...) listing the known names.
ClusterSpec cluster_preset(const std::string& name);

// `--cluster` resolves a preset name or a path ending in .json.
ClusterSpec load_cluster_spec(const std::string& name_or_path);

// JSON field names are the struct's member names; units are in the names (bytes, _s, per_s).
nlohmann::json cluster_spec_to_json(const ClusterSpec& cluster);
ClusterSpec cluster_spec_from_json(const nlohmann::json& json, const std::string& source);

}  // namespace megaplan
