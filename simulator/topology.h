// The cluster as a graph (Boost.Graph): GPUs, one NVSwitch per node, NICs and the fabric between
// nodes. Routes between GPUs are found on it; their bandwidth is the narrowest link's and their
// latency the sum of the links'.
//
// Placement: global rank g runs on GPU g (nodes filled in order, as launchers do). Each GPU sends
// off-node through the NIC of its rail (GPU i of a node uses NIC i * nics / gpus_per_node); the
// GPUs sharing a NIC share its line rate, because the symmetric ranks of a layout (every tensor-
// parallel member, every replica) communicate at the same time.
#pragma once

#include <cstdint>
#include <vector>

#include "core/cluster_spec.h"

namespace megaplan::sim {

struct Route {
  double bandwidth_bytes_per_s = 0;  // per direction, per GPU
  double latency_s = 0;
  bool crosses_nodes = false;
};

class Topology {
 public:
  // `cluster` is the job's part of the cluster (select_gpus).
  explicit Topology(const ClusterSpec& cluster);

  int64_t num_gpus() const { return num_gpus_; }
  int64_t node_of(int64_t gpu) const { return gpu / gpus_per_node_; }
  // REQUIRES: both GPUs exist and differ.
  Route route(int64_t from_gpu, int64_t to_gpu) const { return node_of(from_gpu) == node_of(to_gpu) ? intra_ : inter_; }
  // The slowest route between ring neighbours of a group (in its order, wrapping around): the one a
  // ring collective is limited by. A group of one GPU has an infinitely fast, zero-latency route.
  Route ring_route(const std::vector<int64_t>& gpus) const;

 private:
  int64_t num_gpus_;
  int64_t gpus_per_node_;
  // The graph is symmetric: every pair of GPUs in one node sees the same route, and so does every
  // pair in different nodes; both are searched on the graph once, at construction.
  Route intra_;
  Route inter_;
};

}  // namespace megaplan::sim
