// Completeness, message order and deadlock checks.
#include "core/schedule/validation.h"

#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/depth_first_search.hpp>
#include <cstdint>
#include <map>
#include <optional>
#include <set>

#include "core/schedule/dependencies.h"

namespace megaplan {

namespace {

struct Cell {
  std::size_t rank;
  std::size_t step;
};

// One row per rank; the marked cells are written >>like this<<.
std::string render_grid(const PipelineSchedule& schedule, const std::vector<Cell>& marked) {
  std::string grid;
  for (std::size_t rank = 0; rank < schedule.ranks.size(); ++rank) {
    grid += "rank " + std::to_string(rank) + ":";
    for (std::size_t step = 0; step < schedule.ranks[rank].size(); ++step) {
      bool mark = false;
      for (const Cell& cell : marked) mark = mark || (cell.rank == rank && cell.step == step);
      const std::string text = to_string(schedule.ranks[rank][step]);
      grid += " " + (mark ? ">>" + text + "<<" : text);
    }
    grid += "\n";
  }
  return grid;
}

std::string where(const PipelineSchedule& schedule, const Cell& cell) {
  return to_string(schedule.ranks[cell.rank][cell.step]) + " (rank " + std::to_string(cell.rank) + ", step " +
         std::to_string(cell.step) + ")";
}

bool is_message(const Action& action) {
  return action.kind == ActionKind::kSendForward || action.kind == ActionKind::kRecvForward ||
         action.kind == ActionKind::kSendBackward || action.kind == ActionKind::kRecvBackward;
}

[[noreturn]] void fail(const PipelineSchedule& schedule, const std::string& rule, const std::vector<Cell>& marked) {
  throw ScheduleError(rule, render_grid(schedule, marked));
}

// Each action on its rank, with valid indices; each (stage, microbatch) computed exactly once.
void check_placement_and_completeness(const PipelineSchedule& schedule, std::vector<Cell>& cells) {
  const ScheduleShape& shape = schedule.shape;
  const DependencyKeyIndex index(shape);
  constexpr std::size_t kNone = SIZE_MAX;
  std::vector<std::size_t> computed(index.size(), kNone);  // cell number of each F and gradient
  const auto count = [&](const Action& part, const Cell& cell) {
    for (const DependencyKey& key : provided_keys(part)) {
      std::size_t& first = computed[index(key)];
      if (first != kNone) {
        fail(schedule, "duplicate: " + where(schedule, cell) + " repeats the work of " + where(schedule, cells[first]),
             {cell, cells[first]});
      }
      first = cells.size() - 1;
    }
  };
  for (std::size_t rank = 0; rank < schedule.ranks.size(); ++rank) {
    for (std::size_t step = 0; step < schedule.ranks[rank].size(); ++step) {
      const Action& action = schedule.ranks[rank][step];
      const Cell cell{rank, step};
      cells.push_back(cell);
      if (action.kind == ActionKind::kOptimizer) {
        if (step + 1 != schedule.ranks[rank].size()) fail(schedule, where(schedule, cell) + " must be the rank's last action", {cell});
        continue;
      }
      for (const Action& part : parts_of(action)) {
        const bool has_microbatch = part.kind != ActionKind::kReduceGrad;
        if (part.stage < 0 || part.stage >= shape.num_stages ||
            (has_microbatch && (part.microbatch < 0 || part.microbatch >= shape.microbatches))) {
          fail(schedule, where(schedule, cell) + " is outside " + std::to_string(shape.num_stages) + " stages x " +
                             std::to_string(shape.microbatches) + " microbatches", {cell});
        }
        if (shape.rank_of_stage(part.stage) != static_cast<int64_t>(rank)) {
          fail(schedule, where(schedule, cell) + " belongs to rank " + std::to_string(shape.rank_of_stage(part.stage)),
               {cell});
        }
        const ActionKind kind = part.kind;
        if (is_message(part)) {
          const int64_t peer = message_peer_stage(part);
          if (peer < 0 || peer >= shape.num_stages) {
            fail(schedule, where(schedule, cell) + " has no neighbouring stage to exchange with", {cell});
          }
        }
        if (kind == ActionKind::kForward || kind == ActionKind::kBackward || kind == ActionKind::kBackwardInput ||
            kind == ActionKind::kBackwardWeight) {
          count(part, cell);
        }
      }
    }
  }
  for (int64_t stage = 0; stage < shape.num_stages; ++stage) {
    for (int64_t microbatch = 0; microbatch < shape.microbatches; ++microbatch) {
      for (ActionKind kind : {ActionKind::kForward, ActionKind::kBackwardInput, ActionKind::kBackwardWeight}) {
        if (computed[index({kind, stage, microbatch})] == kNone) {
          const Action missing = make_action(kind == ActionKind::kBackwardInput ? ActionKind::kBackward : kind,
                                             stage, microbatch);
          fail(schedule, "incomplete: no rank runs " + to_string(missing) +
                             (kind == ActionKind::kForward ? "" : " (a B, or an I and a W)"), {});
        }
      }
    }
  }
}

// On every directed pair of ranks the k-th send must match the k-th receive.
void check_message_order(const PipelineSchedule& schedule) {
  const ScheduleShape& shape = schedule.shape;
  std::map<std::pair<int64_t, int64_t>, std::vector<Cell>> sends, receives;
  for (std::size_t rank = 0; rank < schedule.ranks.size(); ++rank) {
    for (std::size_t step = 0; step < schedule.ranks[rank].size(); ++step) {
      const Action& action = schedule.ranks[rank][step];
      if (!is_message(action)) continue;
      const auto here = static_cast<int64_t>(rank);
      const int64_t peer = shape.rank_of_stage(message_peer_stage(action));
      const bool is_send = action.kind == ActionKind::kSendForward || action.kind == ActionKind::kSendBackward;
      if (is_send) {
        sends[{here, peer}].push_back({rank, step});
      } else {
        receives[{peer, here}].push_back({rank, step});
      }
    }
  }
  const auto matches = [&](const Cell& send_cell, const Cell& receive_cell) {
    return matching_receive(schedule.ranks[send_cell.rank][send_cell.step]) ==
           schedule.ranks[receive_cell.rank][receive_cell.step];
  };
  std::set<std::pair<int64_t, int64_t>> links;
  for (const auto& [link, cells] : sends) links.insert(link);
  for (const auto& [link, cells] : receives) links.insert(link);
  for (const auto& link : links) {
    const std::vector<Cell>& link_sends = sends[link];
    const std::vector<Cell>& link_receives = receives[link];
    const std::size_t common = std::min(link_sends.size(), link_receives.size());
    for (std::size_t i = 0; i < common; ++i) {
      if (!matches(link_sends[i], link_receives[i])) {
        fail(schedule, "out-of-order messages from rank " + std::to_string(link.first) + " to rank " +
                           std::to_string(link.second) + ": message " + std::to_string(i) + " is sent as " +
                           where(schedule, link_sends[i]) + " but received as " + where(schedule, link_receives[i]),
             {link_sends[i], link_receives[i]});
      }
    }
    if (link_sends.size() != link_receives.size()) {
      const Cell extra = link_sends.size() > common ? link_sends[common] : link_receives[common];
      fail(schedule, "unmatched message from rank " + std::to_string(link.first) + " to rank " +
                         std::to_string(link.second) + ": " + where(schedule, extra) + " has no partner", {extra});
    }
  }
}

using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS>;
using Vertex = boost::graph_traits<Graph>::vertex_descriptor;

// Records the first back edge (a cycle closes there) and the DFS tree to walk the cycle back.
struct CycleFinder : boost::default_dfs_visitor {
  std::vector<Vertex>* parent;
  std::optional<std::pair<Vertex, Vertex>>* first_back_edge;
  void tree_edge(boost::graph_traits<Graph>::edge_descriptor edge, const Graph& graph) const {
    (*parent)[boost::target(edge, graph)] = boost::source(edge, graph);
  }
  void back_edge(boost::graph_traits<Graph>::edge_descriptor edge, const Graph& graph) const {
    if (!*first_back_edge) *first_back_edge = std::make_pair(boost::source(edge, graph), boost::target(edge, graph));
  }
};

// REQUIRES: cells lists every action rank by rank, step by step (vertex v is cells[v]), and every
// action lies within the shape (check_placement_and_completeness passed).
void check_happens_before(const PipelineSchedule& schedule, const std::vector<Cell>& cells) {
  const DependencyKeyIndex index(schedule.shape);
  constexpr Vertex kNone = SIZE_MAX;
  std::vector<Vertex> provider(index.size(), kNone);
  for (std::size_t v = 0; v < cells.size(); ++v) {
    for (const DependencyKey& key : provided_keys(schedule.ranks[cells[v].rank][cells[v].step])) {
      if (provider[index(key)] == kNone) provider[index(key)] = v;
    }
  }
  Graph graph(cells.size());
  for (std::size_t v = 0; v < cells.size(); ++v) {
    const Cell& cell = cells[v];
    if (cell.step > 0) boost::add_edge(v - 1, v, graph);  // program order
    for (const Action& needed : dependencies(schedule.ranks[cell.rank][cell.step], schedule.shape, schedule.lowered)) {
      const Vertex found = provider[index(dependency_key(needed))];
      if (found == kNone) {
        fail(schedule, where(schedule, cell) + " waits for " + to_string(needed) + ", which no rank runs", {cell});
      }
      boost::add_edge(found, v, graph);
    }
  }
  std::vector<Vertex> parent(cells.size());
  for (std::size_t v = 0; v < parent.size(); ++v) parent[v] = v;
  std::optional<std::pair<Vertex, Vertex>> back_edge;
  CycleFinder finder;
  finder.parent = &parent;
  finder.first_back_edge = &back_edge;
  boost::depth_first_search(graph, boost::visitor(finder));
  if (!back_edge) return;
  // The back edge u -> v closes the cycle v -> ... -> u -> v along the DFS tree.
  std::vector<Cell> cycle;
  for (Vertex at = back_edge->first;; at = parent[at]) {
    cycle.insert(cycle.begin(), cells[at]);
    if (at == back_edge->second || parent[at] == at) break;
  }
  std::string path;
  for (const Cell& cell : cycle) path += where(schedule, cell) + " -> ";
  path += to_string(schedule.ranks[cycle.front().rank][cycle.front().step]);
  fail(schedule, "deadlock: these actions wait on each other: " + path, cycle);
}

}  // namespace

void validate_schedule(const PipelineSchedule& schedule) {
  std::vector<Cell> cells;
  check_placement_and_completeness(schedule, cells);
  if (schedule.lowered) check_message_order(schedule);
  check_happens_before(schedule, cells);
}

}  // namespace megaplan
