// Completeness, message order and deadlock checks.
#include "core/schedule/validation.h"

#include <algorithm>
#include <boost/graph/compressed_sparse_row_graph.hpp>
#include <boost/graph/depth_first_search.hpp>
#include <boost/range/iterator_range.hpp>
#include <cstdint>
#include <optional>
#include <stdexcept>

#include "core/hot_loop.h"
#include "core/schedule/dependencies.h"

namespace megaplan {

namespace {

struct Cell {
  std::size_t rank;
  std::size_t step;
};

// One row per rank; the marked cells are written >>like this<<. A large schedule shows, per rank,
// only the steps near its marked cells (or its first steps), with "..." for what is left out, so
// an error on a million-action schedule stays readable.
std::string render_grid(const PipelineSchedule& schedule, const std::vector<Cell>& marked) {
  constexpr std::size_t kWholeGridActions = 2000;
  constexpr std::size_t kContext = 12;
  std::size_t total = 0;
  for (const auto& actions : schedule.ranks) total += actions.size();
  std::string grid;
  for (std::size_t rank = 0; rank < schedule.ranks.size(); ++rank) {
    const std::size_t steps = schedule.ranks[rank].size();
    std::vector<bool> shown(steps, total <= kWholeGridActions);
    bool any_marked = false;
    for (const Cell& cell : marked) {
      if (cell.rank != rank) continue;
      any_marked = true;
      const std::size_t from = cell.step >= kContext ? cell.step - kContext : 0;
      for (std::size_t step = from; step < std::min(steps, cell.step + kContext + 1); ++step) shown[step] = true;
    }
    if (!any_marked) {
      for (std::size_t step = 0; step < std::min(steps, kContext); ++step) shown[step] = true;
    }
    grid += "rank " + std::to_string(rank) + ":";
    bool elided = false;
    for (std::size_t step = 0; step < steps; ++step) {
      if (!shown[step]) {
        if (!elided) grid += " ...";
        elided = true;
        continue;
      }
      elided = false;
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

[[noreturn]] void fail(const PipelineSchedule& schedule, const std::string& rule, const std::vector<Cell>& marked) {
  throw ScheduleError(rule, render_grid(schedule, marked));
}

// One action on its rank, with indices inside the shape and a neighbour to talk to; OPTIM last.
// Not inlined: run_ranks calls it only for the rare actions plainly_placed does not cover.
[[gnu::noinline]] void check_action_placement(const PipelineSchedule& schedule, std::size_t rank, std::size_t step) {
  const ScheduleShape& shape = schedule.shape;
  const std::vector<Action>& actions = schedule.ranks[rank];
  const Action& action = actions[step];
  const Cell cell{rank, step};
  if (action.kind == ActionKind::kOptimizer) {
    if (step + 1 != actions.size()) fail(schedule, where(schedule, cell) + " must be the rank's last action", {cell});
    return;
  }
  for (const Action& part : parts_of(action)) {
    const bool has_microbatch = part.kind != ActionKind::kReduceGrad;
    if (part.stage < 0 || part.stage >= shape.num_stages ||
        (has_microbatch && (part.microbatch < 0 || part.microbatch >= shape.microbatches))) {
      fail(schedule,
           where(schedule, cell) + " is outside " + std::to_string(shape.num_stages) + " stages x " +
               std::to_string(shape.microbatches) + " microbatches",
           {cell});
    }
    if (shape.rank_of_stage(part.stage) != static_cast<int64_t>(rank)) {
      fail(schedule, where(schedule, cell) + " belongs to rank " + std::to_string(shape.rank_of_stage(part.stage)),
           {cell});
    }
    if (is_message(part.kind)) {
      const int64_t peer = message_peer_stage(part);
      if (peer < 0 || peer >= shape.num_stages) {
        fail(schedule, where(schedule, cell) + " has no neighbouring stage to exchange with", {cell});
      }
    }
  }
}

// The common case of check_action_placement, cheaply: a single computation or message inside the
// shape on its own rank, with its neighbour inside the shape. Anything else takes the full check.
// `stage_ranks[s]` is shape.rank_of_stage(s), looked up once per action rather than computed.
inline bool plainly_placed(const Action& action, const ScheduleShape& shape, const std::vector<int32_t>& stage_ranks,
                           std::size_t rank) {
  if (action.kind == ActionKind::kOptimizer || action.kind == ActionKind::kOverlapForwardBackward ||
      action.kind == ActionKind::kReduceGrad) {
    return false;
  }
  if (action.stage < 0 || action.stage >= shape.num_stages || action.microbatch < 0 ||
      action.microbatch >= shape.microbatches ||
      stage_ranks[static_cast<std::size_t>(action.stage)] != static_cast<int32_t>(rank)) {
    return false;
  }
  if (!is_message(action.kind)) return true;
  const int64_t peer = message_peer_stage(action);
  return peer >= 0 && peer < shape.num_stages;
}

void check_placement(const PipelineSchedule& schedule, const std::vector<int32_t>& stage_ranks) {
  for (std::size_t rank = 0; rank < schedule.ranks.size(); ++rank) {
    const std::vector<Action>& actions = schedule.ranks[rank];
    for (std::size_t step = 0; step < actions.size(); ++step) {
      if (!plainly_placed(actions[step], schedule.shape, stage_ranks, rank))
        check_action_placement(schedule, rank, step);
    }
  }
}

// Every cell whose action provides `key`, in rank-major order (for error messages only).
std::vector<Cell> providers_of(const PipelineSchedule& schedule, const DependencyKey& key) {
  std::vector<Cell> cells;
  for (std::size_t rank = 0; rank < schedule.ranks.size(); ++rank) {
    for (std::size_t step = 0; step < schedule.ranks[rank].size(); ++step) {
      for_each_provided_key(schedule.ranks[rank][step], [&](const DependencyKey& provided) {
        if (provided == key) cells.push_back({rank, step});
      });
    }
  }
  return cells;
}

// Every (stage, microbatch) has its forward, input gradient and weight gradient.
// `done` marks (by DependencyKeyIndex) what ran, or what some action provides.
void check_completeness(const PipelineSchedule& schedule, const KeyFlags& done) {
  const ScheduleShape& shape = schedule.shape;
  const DependencyKeyIndex index(shape);
  for (int64_t stage = 0; stage < shape.num_stages; ++stage) {
    for (int64_t microbatch = 0; microbatch < shape.microbatches; ++microbatch) {
      for (ActionKind kind : {ActionKind::kForward, ActionKind::kBackwardInput, ActionKind::kBackwardWeight}) {
        if (!done.test(index({kind, stage, microbatch}))) {
          const Action missing =
              make_action(kind == ActionKind::kBackwardInput ? ActionKind::kBackward : kind, stage, microbatch);
          fail(schedule,
               "incomplete: no rank runs " + to_string(missing) +
                   (kind == ActionKind::kForward ? "" : " (a B, or an I and a W)"),
               {});
        }
      }
    }
  }
}

// On every directed pair of ranks the k-th send must match the k-th receive.
void check_message_order(const PipelineSchedule& schedule) {
  const ScheduleShape& shape = schedule.shape;
  const auto pp = static_cast<std::size_t>(schedule.ranks.size());
  // Steps of each link's sends (on the sender) and receives (on the receiver); link = from * pp + to.
  std::vector<std::vector<uint32_t>> sends(pp * pp), receives(pp * pp);
  for (std::size_t rank = 0; rank < pp; ++rank) {
    for (std::size_t step = 0; step < schedule.ranks[rank].size(); ++step) {
      const Action& action = schedule.ranks[rank][step];
      if (!is_message(action.kind)) continue;
      const auto peer = static_cast<std::size_t>(shape.rank_of_stage(message_peer_stage(action)));
      const bool is_send = action.kind == ActionKind::kSendForward || action.kind == ActionKind::kSendBackward;
      if (is_send) {
        sends[rank * pp + peer].push_back(static_cast<uint32_t>(step));
      } else {
        receives[peer * pp + rank].push_back(static_cast<uint32_t>(step));
      }
    }
  }
  for (std::size_t link = 0; link < pp * pp; ++link) {
    const std::size_t from = link / pp;
    const std::size_t to = link % pp;
    const std::vector<uint32_t>& link_sends = sends[link];
    const std::vector<uint32_t>& link_receives = receives[link];
    const std::size_t common = std::min(link_sends.size(), link_receives.size());
    for (std::size_t i = 0; i < common; ++i) {
      const Cell send{from, link_sends[i]};
      const Cell receive{to, link_receives[i]};
      if (!(matching_receive(schedule.ranks[from][send.step]) == schedule.ranks[to][receive.step])) {
        fail(schedule,
             "out-of-order messages from rank " + std::to_string(from) + " to rank " + std::to_string(to) +
                 ": message " + std::to_string(i) + " is sent as " + where(schedule, send) + " but received as " +
                 where(schedule, receive),
             {send, receive});
      }
    }
    if (link_sends.size() != link_receives.size()) {
      const Cell extra = link_sends.size() > common ? Cell{from, link_sends[common]} : Cell{to, link_receives[common]};
      fail(schedule,
           "unmatched message from rank " + std::to_string(from) + " to rank " + std::to_string(to) + ": " +
               where(schedule, extra) + " has no partner",
           {extra});
    }
  }
}

// The happens-before graph in compressed sparse row form: built once from an edge list, walked
// without allocation.
using Graph = boost::compressed_sparse_row_graph<boost::directedS>;
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

// The slow path, once the schedule is known to be stuck: the happens-before graph of program order
// and dependency edges on Boost.Graph, searched depth-first for a cycle to name.
// REQUIRES: every action lies within the shape and every dependency has a provider (the stuck
// path of check_by_running checked both).
[[noreturn]] void name_cycle(const PipelineSchedule& schedule) {
  std::vector<Cell> cells;
  for (std::size_t rank = 0; rank < schedule.ranks.size(); ++rank) {
    for (std::size_t step = 0; step < schedule.ranks[rank].size(); ++step) cells.push_back({rank, step});
  }
  const DependencyKeyIndex index(schedule.shape);
  constexpr Vertex kNone = SIZE_MAX;
  std::vector<Vertex> provider(index.size(), kNone);
  for (std::size_t v = 0; v < cells.size(); ++v) {
    for_each_provided_key(schedule.ranks[cells[v].rank][cells[v].step], [&](const DependencyKey& key) {
      if (provider[index(key)] == kNone) provider[index(key)] = v;
    });
  }
  std::vector<std::pair<Vertex, Vertex>> edges;
  edges.reserve(3 * cells.size());
  for (std::size_t v = 0; v < cells.size(); ++v) {
    const Cell& cell = cells[v];
    if (cell.step > 0) edges.emplace_back(v - 1, v);  // program order
    for_each_dependency(schedule.ranks[cell.rank][cell.step], schedule.shape, schedule.lowered,
                        [&](const Action& needed) {
                          const Vertex found = provider[index(dependency_key(needed))];
                          if (found == kNone) throw std::logic_error("name_cycle: a dependency without a provider");
                          edges.emplace_back(found, v);
                        });
  }
  const Graph graph(boost::edges_are_unsorted_multi_pass, edges.begin(), edges.end(), cells.size());

  std::vector<Vertex> parent(cells.size());
  for (std::size_t v = 0; v < parent.size(); ++v) parent[v] = v;
  std::optional<std::pair<Vertex, Vertex>> back_edge;
  CycleFinder finder;
  finder.parent = &parent;
  finder.first_back_edge = &back_edge;
  boost::depth_first_search(graph, boost::visitor(finder));
  if (!back_edge) throw std::logic_error("validate_schedule: a stuck schedule without a cycle");
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

// Where running the ranks stopped: every action ran, no rank could move, an action repeated work
// already done, a receive was not the message its link owes next, or every action ran and a sent
// message was never received.
struct RunOutcome {
  enum class Kind { kFinished, kStuck, kDuplicate, kMessageMismatch } kind = Kind::kFinished;
  Cell cell{0, 0};
  DependencyKey key{};  // kDuplicate: the work repeated
};

// Whether providing `key` a second time repeats work. Every key names one event of the iteration —
// a computation, a message, a stage's gradient reduction — except OPTIM's, which every rank runs
// once (check_action_placement keeps it last). Messages count too: a receive waits for its send's
// key, so with a send or receive repeated, "the key is done" would no longer mean "this link's
// next message is here", which the message check below relies on (and an executor would pair
// the repeated message with the wrong partner).
bool repeats_work(const DependencyKey& key) { return key.kind != ActionKind::kOptimizer; }

// Runs the ranks as far as their dependencies allow: Kahn's algorithm over the happens-before
// graph, with each rank's program order walked in place rather than stored as edges. On the way it
// finds repeated work and checks, on every link, that the k-th receive run is the k-th send's
// partner (ranks run in program order, so run order is program order per link, and with no
// message repeated a receive runs only once its own send has). So a mismatch found here is one
// check_message_order finds in program order too. Each action's placement is checked when first
// reached, before anything indexes by its stage.
// Flattened: this loop runs once per action of a million-action schedule, and every helper it calls
// (the dependency rule, the key index, the bit set) must inline into it to keep it a few dozen
// instructions per action. Reporting is left to the caller, outside the loop.
constexpr std::size_t kPrefetchRanks = 2;
constexpr std::size_t kPrefetchActions = 8;
MEGAPLAN_HOT_LOOP RunOutcome run_ranks(const PipelineSchedule& schedule, const std::vector<int32_t>& stage_ranks,
                                       KeyFlags& done) {
  // Copies, not references: the loop's stores (done bits, counters) could alias the schedule's
  // fields as far as the compiler knows, which would reload them on every action.
  const ScheduleShape shape = schedule.shape;
  const bool lowered = schedule.lowered;
  const DependencyKeyIndex index(shape);
  const std::size_t pp = schedule.ranks.size();
  std::vector<std::size_t> next(pp, 0);
  std::vector<std::size_t> placed(pp, 0);  // steps whose placement is checked
  // By link from * pp + to: the receives the sender has sent and the receiver not yet run,
  // from owed_head on (the consumed front is dropped when the queue empties).
  std::vector<std::vector<Action>> owed(pp * pp);
  std::vector<std::size_t> owed_head(pp * pp, 0);
  std::size_t remaining = 0;
  for (const auto& actions : schedule.ranks) remaining += actions.size();
  bool progress = true;
  while (remaining > 0 && progress) {
    progress = false;
    for (std::size_t rank = 0; rank < pp; ++rank) {
      const std::vector<Action>& actions = schedule.ranks[rank];
      std::size_t step = next[rank];
      const std::size_t start = step;
      std::size_t placed_until = placed[rank];
      // A rank usually runs a few actions and then waits on a message, so the ranks' lists are read
      // as pp slow streams the hardware prefetcher does not follow: fetch the next ranks' lines now.
      for (std::size_t ahead = 1; ahead <= kPrefetchRanks && ahead < pp; ++ahead) {
        const std::size_t other = rank + ahead < pp ? rank + ahead : rank + ahead - pp;  // no division
        if (next[other] < schedule.ranks[other].size()) __builtin_prefetch(schedule.ranks[other].data() + next[other]);
      }
      if (step + kPrefetchActions < actions.size()) __builtin_prefetch(actions.data() + step + kPrefetchActions);
      for (; step < actions.size(); ++step) {
        const Action& action = actions[step];
        if (placed_until == step) {
          if (!plainly_placed(action, shape, stage_ranks, rank)) check_action_placement(schedule, rank, step);
          ++placed_until;
        }
        bool ready = true;
        for_each_dependency(action, shape, lowered,
                            [&](const Action& needed) { ready = ready && done.test(index(dependency_key(needed))); });
        if (!ready) break;
        RunOutcome duplicate;
        for_each_provided_key(action, [&](const DependencyKey& key) {
          const std::size_t slot = index(key);
          if (done.test(slot) && repeats_work(key)) duplicate = {RunOutcome::Kind::kDuplicate, {rank, step}, key};
          done.set(slot);
        });
        if (duplicate.kind != RunOutcome::Kind::kFinished) return duplicate;
        if (is_message(action.kind)) {
          const auto peer = static_cast<std::size_t>(stage_ranks[static_cast<std::size_t>(message_peer_stage(action))]);
          if (action.kind == ActionKind::kSendForward || action.kind == ActionKind::kSendBackward) {
            owed[rank * pp + peer].push_back(matching_receive(action));
          } else {
            std::vector<Action>& link = owed[peer * pp + rank];
            std::size_t& head = owed_head[peer * pp + rank];
            if (head == link.size() || !(link[head] == action)) {
              return {RunOutcome::Kind::kMessageMismatch, {rank, step}, {}};
            }
            if (++head == link.size()) {
              link.clear();
              head = 0;
            }
          }
        }
      }
      next[rank] = step;
      placed[rank] = placed_until;
      remaining -= step - start;
      progress = progress || step != start;
    }
  }
  // Stuck ranks leave messages in flight that their receives, never reached, would have taken:
  // only a finished run proves a send unmatched.
  if (remaining > 0) return {RunOutcome::Kind::kStuck, {0, 0}, {}};
  for (std::size_t link = 0; link < owed.size(); ++link) {
    if (owed_head[link] != owed[link].size()) return {RunOutcome::Kind::kMessageMismatch, {0, 0}, {}};
  }
  return {RunOutcome::Kind::kFinished, {0, 0}, {}};
}

// run_ranks, and when it finds a problem, or no rank can move and some are unfinished, the full
// checks in their usual order to name the first problem: placement, repeated work, message order,
// missing work, waits on work nobody runs, and last the cycle (name_cycle).
void check_by_running(const PipelineSchedule& schedule) {
  const std::vector<int32_t> stage_ranks = rank_of_each_stage(schedule.shape);
  const ScheduleShape& shape = schedule.shape;
  const DependencyKeyIndex index(shape);
  KeyFlags done(index.size());
  const RunOutcome outcome = run_ranks(schedule, stage_ranks, done);
  if (outcome.kind == RunOutcome::Kind::kFinished) {
    check_completeness(schedule, done);
    return;
  }
  // The reports below read actions run_ranks did not reach: check where they all sit first.
  check_placement(schedule, stage_ranks);
  if (outcome.kind == RunOutcome::Kind::kDuplicate) {
    const Cell first = providers_of(schedule, outcome.key).front();
    fail(schedule, "duplicate: " + where(schedule, outcome.cell) + " repeats the work of " + where(schedule, first),
         {outcome.cell, first});
  }
  if (outcome.kind == RunOutcome::Kind::kMessageMismatch) {
    // run_ranks stopped at a receive that is not its link's next message in program order, or
    // finished with more sends than receives on a link: either way this names one.
    check_message_order(schedule);
    throw std::logic_error("validate_schedule: a message mismatch the full check did not find");
  }
  if (schedule.lowered) check_message_order(schedule);
  KeyFlags provided(index.size());
  for (const auto& actions : schedule.ranks) {
    for (const Action& action : actions) {
      for_each_provided_key(action, [&](const DependencyKey& key) { provided.set(index(key)); });
    }
  }
  check_completeness(schedule, provided);
  for (std::size_t rank = 0; rank < schedule.ranks.size(); ++rank) {
    for (std::size_t step = 0; step < schedule.ranks[rank].size(); ++step) {
      for_each_dependency(schedule.ranks[rank][step], shape, schedule.lowered, [&](const Action& needed) {
        if (!provided.test(index(dependency_key(needed)))) {
          const Cell cell{rank, step};
          fail(schedule, where(schedule, cell) + " waits for " + to_string(needed) + ", which no rank runs", {cell});
        }
      });
    }
  }
  name_cycle(schedule);
}

}  // namespace

void validate_schedule(const PipelineSchedule& schedule) { check_by_running(schedule); }

}  // namespace megaplan
