// Routes on the cluster graph: NVLink inside a node, the rail NIC across nodes.
#include <catch2/catch.hpp>

#include "core/cluster_spec.h"
#include "simulator/topology.h"

TEST_CASE("routes inside a node use NVLink; across nodes, the NIC's line rate", "[simulator][topology]") {
  const megaplan::ClusterSpec cluster = megaplan::select_gpus(megaplan::cluster_preset("dgx-h100"), 16);
  const megaplan::sim::Topology topology(cluster);
  CHECK(topology.num_gpus() == 16);
  const auto intra = topology.route(0, 7);
  CHECK(intra.bandwidth_bytes_per_s == Approx(cluster.intra_node.bandwidth_per_gpu_bytes_per_s));
  CHECK(intra.latency_s == Approx(cluster.intra_node.latency_s));
  CHECK_FALSE(intra.crosses_nodes);
  const auto inter = topology.route(3, 11);
  CHECK(inter.crosses_nodes);
  // Eight NICs for eight GPUs: each GPU has its NIC's 400 Gb/s = 50 GB/s.
  CHECK(inter.bandwidth_bytes_per_s == Approx(cluster.inter_node.bandwidth_per_nic_bytes_per_s));
  CHECK(inter.latency_s == Approx(cluster.inter_node.latency_s));
  // A ring is as slow as its slowest hop.
  CHECK(topology.ring_route({0, 1, 2, 3}).bandwidth_bytes_per_s == Approx(intra.bandwidth_bytes_per_s));
  CHECK(topology.ring_route({0, 8}).crosses_nodes);
  CHECK(topology.ring_route({5}).latency_s == 0);
}

TEST_CASE("GPUs sharing a NIC share its line rate", "[simulator][topology]") {
  megaplan::ClusterSpec cluster = megaplan::select_gpus(megaplan::cluster_preset("dgx-h100"), 16);
  cluster.inter_node.nics_per_node = 2;  // four GPUs per NIC
  const megaplan::sim::Topology topology(cluster);
  CHECK(topology.route(0, 8).bandwidth_bytes_per_s == Approx(cluster.inter_node.bandwidth_per_nic_bytes_per_s / 4));
}
