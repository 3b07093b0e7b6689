// Building the cluster graph and searching its two kinds of route.
#include "simulator/topology.h"

#include <algorithm>
#include <limits>

#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/breadth_first_search.hpp>

namespace megaplan::sim {

namespace {

struct Link {
  double bandwidth_bytes_per_s = 0;
  double latency_s = 0;
};

using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::undirectedS, boost::no_property, Link>;
using Vertex = boost::graph_traits<Graph>::vertex_descriptor;

// Vertices: GPUs 0..n-1, then one switch per node, then NICs, then the fabric.
struct ClusterGraph {
  Graph graph;
  Vertex fabric = 0;
};

ClusterGraph build_graph(const ClusterSpec& cluster) {
  const int64_t nodes = cluster.num_nodes;
  const int64_t per_node = cluster.gpus_per_node;
  const int64_t nics = cluster.inter_node.nics_per_node;
  const auto gpus = static_cast<Vertex>(nodes * per_node);
  const auto switches = static_cast<Vertex>(nodes);
  const auto nic_count = static_cast<Vertex>(nodes * nics);
  ClusterGraph result;
  result.graph = Graph(gpus + switches + nic_count + 1);
  result.fabric = gpus + switches + nic_count;
  const double hop_latency = cluster.intra_node.latency_s / 2;  // GPU -> switch -> GPU
  for (int64_t node = 0; node < nodes; ++node) {
    const Vertex node_switch = gpus + static_cast<Vertex>(node);
    for (int64_t local = 0; local < per_node; ++local) {
      const auto gpu = static_cast<Vertex>(node * per_node + local);
      boost::add_edge(gpu, node_switch, Link{cluster.intra_node.bandwidth_per_gpu_bytes_per_s, hop_latency},
                      result.graph);
      if (nics > 0) {
        const int64_t rail = local * nics / per_node;
        const auto nic = gpus + switches + static_cast<Vertex>(node * nics + rail);
        // GPUs sharing a NIC split its line rate; the NIC's latency is charged on the fabric side.
        const double sharers = static_cast<double>(per_node) / static_cast<double>(nics);
        boost::add_edge(gpu, nic, Link{cluster.inter_node.bandwidth_per_nic_bytes_per_s / sharers, 0}, result.graph);
      }
    }
    for (int64_t rail = 0; rail < nics; ++rail) {
      const auto nic = gpus + switches + static_cast<Vertex>(node * nics + rail);
      boost::add_edge(nic, result.fabric,
                      Link{cluster.inter_node.bandwidth_per_nic_bytes_per_s, cluster.inter_node.latency_s / 2},
                      result.graph);
    }
  }
  return result;
}

// Fewest-hop path from one GPU to another (breadth-first search), then its narrowest link and
// summed latency.
Route search(const ClusterGraph& cluster, Vertex from, Vertex to, bool crosses_nodes) {
  const Graph& graph = cluster.graph;
  std::vector<Vertex> predecessor(boost::num_vertices(graph));
  for (Vertex v = 0; v < predecessor.size(); ++v) predecessor[v] = v;
  boost::breadth_first_search(
      graph, from,
      boost::visitor(boost::make_bfs_visitor(boost::record_predecessors(predecessor.data(), boost::on_tree_edge()))));
  Route route;
  route.bandwidth_bytes_per_s = std::numeric_limits<double>::infinity();
  route.crosses_nodes = crosses_nodes;
  for (Vertex at = to; at != from;) {
    const Vertex previous = predecessor[at];
    if (previous == at) return Route{0, std::numeric_limits<double>::infinity(), crosses_nodes};  // unreachable
    const Link& link = graph[boost::edge(previous, at, graph).first];
    route.bandwidth_bytes_per_s = std::min(route.bandwidth_bytes_per_s, link.bandwidth_bytes_per_s);
    route.latency_s += link.latency_s;
    at = previous;
  }
  return route;
}

}  // namespace

Topology::Topology(const ClusterSpec& cluster)
    : num_gpus_(cluster.total_gpus()), gpus_per_node_(cluster.gpus_per_node) {
  // Nodes are alike, so two of them hold every kind of route; searching a 3072-GPU graph would
  // find the same two.
  ClusterSpec two_nodes = cluster;
  two_nodes.num_nodes = std::min<int64_t>(cluster.num_nodes, 2);
  const ClusterGraph graph = build_graph(two_nodes);
  const Route none{std::numeric_limits<double>::infinity(), 0, false};
  intra_ = gpus_per_node_ > 1 ? search(graph, 0, 1, false) : none;
  inter_ = cluster.num_nodes > 1 ? search(graph, 0, static_cast<Vertex>(gpus_per_node_), true) : none;
}

Route Topology::ring_route(const std::vector<int64_t>& gpus) const {
  Route slowest{std::numeric_limits<double>::infinity(), 0, false};
  if (gpus.size() < 2) return slowest;
  for (std::size_t i = 0; i < gpus.size(); ++i) {
    const Route next = route(gpus[i], gpus[(i + 1) % gpus.size()]);
    if (next.bandwidth_bytes_per_s < slowest.bandwidth_bytes_per_s ||
        (next.bandwidth_bytes_per_s == slowest.bandwidth_bytes_per_s && next.latency_s > slowest.latency_s)) {
      slowest = next;
    }
  }
  return slowest;
}

}  // namespace megaplan::sim
