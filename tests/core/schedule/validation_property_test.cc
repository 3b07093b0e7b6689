// Property tests of validate_schedule and of the CSV import behind `schedule --import --check`:
// generated schedules and torch's CSVs, mutated at random with a fixed seed, are either refused with
// a one-line SpecError or really run — as judged by a brute-force run of the ranks written here
// from the rules themselves, not from core/schedule/dependencies.h — and never end in a logic_error.
#include <catch2/catch.hpp>

#include <algorithm>
#include <deque>
#include <exception>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/schedule/lowering.h"
#include "core/schedule/schedule_csv.h"
#include "core/schedule/validation.h"
#include "core/text_file.h"

using megaplan::Action;
using megaplan::ActionKind;
using megaplan::PipelineSchedule;
using megaplan::ScheduleKind;

namespace {

// ---- the brute-force run ---------------------------------------------------------------------

// What running an action leaves behind, by (what, stage, microbatch): the run's own bookkeeping.
enum class Made {
  kForward,
  kInputGradient,
  kWeightGradient,
  kSendForward,
  kSendBackward,
  kRecvForward,
  kRecvBackward,
  kReduceGrad
};
using Fact = std::tuple<Made, int64_t, int64_t>;

bool is_receive(ActionKind kind) { return kind == ActionKind::kRecvForward || kind == ActionKind::kRecvBackward; }
bool is_send(ActionKind kind) { return kind == ActionKind::kSendForward || kind == ActionKind::kSendBackward; }

// Built field by field: make_action refuses the out-of-range indices mutations produce.
Action bare_action(ActionKind kind, int32_t stage, int32_t microbatch) {
  Action action;
  action.kind = kind;
  action.stage = stage;
  action.microbatch = microbatch;
  return action;
}

// The computations (or the one message) an action stands for: an OVERLAP_F_B is two.
std::vector<Action> pieces(const Action& action) {
  if (action.kind != ActionKind::kOverlapForwardBackward) return {action};
  return {bare_action(ActionKind::kForward, action.stage, action.microbatch),
          bare_action(action.backward_kind, action.backward_stage, action.backward_microbatch)};
}

std::vector<Fact> facts_made_by(const Action& piece) {
  const int64_t s = piece.stage;
  const int64_t m = piece.microbatch;
  switch (piece.kind) {
    case ActionKind::kForward: return {{Made::kForward, s, m}};
    case ActionKind::kBackward: return {{Made::kInputGradient, s, m}, {Made::kWeightGradient, s, m}};
    case ActionKind::kBackwardInput: return {{Made::kInputGradient, s, m}};
    case ActionKind::kBackwardWeight: return {{Made::kWeightGradient, s, m}};
    case ActionKind::kSendForward: return {{Made::kSendForward, s, m}};
    case ActionKind::kSendBackward: return {{Made::kSendBackward, s, m}};
    case ActionKind::kRecvForward: return {{Made::kRecvForward, s, m}};
    case ActionKind::kRecvBackward: return {{Made::kRecvBackward, s, m}};
    case ActionKind::kReduceGrad: return {{Made::kReduceGrad, s, -1}};
    default: return {};
  }
}

// Runs every rank's list in order, each action once its inputs exist: receives block until their
// link holds a message and must be the one at its head (NCCL pairs point-to-point calls in order),
// sends never block (torch posts them with isend). Valid: every rank finishes, no message is left
// unreceived, nothing is done twice, and every (stage, microbatch) has its F, I and W (or B).
class BruteForceRun {
 public:
  explicit BruteForceRun(const PipelineSchedule& schedule) : schedule_(schedule), shape_(schedule.shape) {}

  // Why the schedule cannot run to completion, or nothing when it can.
  std::optional<std::string> problem() {
    for (std::size_t rank = 0; rank < schedule_.ranks.size(); ++rank) {
      for (std::size_t step = 0; step < schedule_.ranks[rank].size(); ++step) {
        if (auto misplaced = misplacement(rank, step)) return misplaced;
      }
    }
    if (auto repeated = repetition()) return repeated;
    if (auto stopped = run()) return stopped;
    for (const auto& [link, messages] : links_) {
      if (!messages.empty()) return "a message to rank " + std::to_string(link.second) + " is never received";
    }
    return missing_work();
  }

 private:
  int64_t rank_of(int64_t stage) const { return shape_.rank_of_stage(stage); }

  std::optional<std::string> misplacement(std::size_t rank, std::size_t step) const {
    const Action& action = schedule_.ranks[rank][step];
    if (action.kind == ActionKind::kOptimizer) {
      return step + 1 == schedule_.ranks[rank].size() ? std::nullopt : std::optional<std::string>("OPTIM not last");
    }
    for (const Action& piece : pieces(action)) {
      const bool has_microbatch = piece.kind != ActionKind::kReduceGrad;
      if (piece.stage < 0 || piece.stage >= shape_.num_stages) return "stage out of range";
      if (has_microbatch && (piece.microbatch < 0 || piece.microbatch >= shape_.microbatches)) {
        return "microbatch out of range";
      }
      if (rank_of(piece.stage) != static_cast<int64_t>(rank)) return "on the wrong rank";
      const bool toward_next = piece.kind == ActionKind::kSendForward || piece.kind == ActionKind::kRecvBackward;
      const bool toward_previous = piece.kind == ActionKind::kRecvForward || piece.kind == ActionKind::kSendBackward;
      if ((toward_next && piece.stage + 1 >= shape_.num_stages) || (toward_previous && piece.stage == 0)) {
        return "a message without a peer stage";
      }
    }
    return std::nullopt;
  }

  std::optional<std::string> repetition() const {
    std::set<Fact> seen;
    for (const auto& actions : schedule_.ranks) {
      for (const Action& action : actions) {
        for (const Action& piece : pieces(action)) {
          for (const Fact& fact : facts_made_by(piece)) {
            if (!seen.insert(fact).second) return "repeats " + megaplan::to_string(action);
          }
        }
      }
    }
    return std::nullopt;
  }

  bool made(Made what, int64_t stage, int64_t microbatch) const { return done_.count({what, stage, microbatch}) > 0; }

  // The activations stage s consumes: the previous stage's forward, through a receive when the
  // schedule is lowered and that stage sits on another rank.
  bool has_input(int64_t s, int64_t m) const {
    if (s == 0) return true;
    if (schedule_.lowered && rank_of(s - 1) != rank_of(s)) return made(Made::kRecvForward, s, m);
    return made(Made::kForward, s - 1, m);
  }

  // The gradient stage s's backward consumes: the next stage's input gradient, likewise.
  bool has_output_gradient(int64_t s, int64_t m) const {
    if (s == shape_.num_stages - 1) return true;
    if (schedule_.lowered && rank_of(s + 1) != rank_of(s)) return made(Made::kRecvBackward, s, m);
    return made(Made::kInputGradient, s + 1, m);
  }

  bool inputs_ready(const Action& piece) const {
    const int64_t s = piece.stage;
    const int64_t m = piece.microbatch;
    switch (piece.kind) {
      case ActionKind::kForward: return has_input(s, m);
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput: return made(Made::kForward, s, m) && has_output_gradient(s, m);
      case ActionKind::kBackwardWeight: return made(Made::kInputGradient, s, m);
      case ActionKind::kSendForward: return made(Made::kForward, s, m);
      case ActionKind::kSendBackward: return made(Made::kInputGradient, s, m);
      case ActionKind::kReduceGrad:
        for (int64_t microbatch = 0; microbatch < shape_.microbatches; ++microbatch) {
          if (!made(Made::kWeightGradient, s, microbatch)) return false;
        }
        return true;
      default: return true;  // receives wait on their link instead; OPTIM on nothing
    }
  }

  static Action receive_for(const Action& send) {
    const bool forward = send.kind == ActionKind::kSendForward;
    return bare_action(forward ? ActionKind::kRecvForward : ActionKind::kRecvBackward,
                       forward ? send.stage + 1 : send.stage - 1, send.microbatch);
  }

  int64_t sender_of(const Action& receive) const {
    return rank_of(receive.kind == ActionKind::kRecvForward ? receive.stage - 1 : receive.stage + 1);
  }

  // Runs `rank`'s next action if it can: true when it ran; sets mismatch_ on a receive whose link
  // delivers another message first.
  bool step(std::size_t rank) {
    const Action& action = schedule_.ranks[rank][next_[rank]];
    if (is_receive(action.kind)) {
      std::deque<Action>& link = links_[{sender_of(action), static_cast<int64_t>(rank)}];
      if (link.empty()) return false;
      if (!(link.front() == action)) {
        mismatch_ = "rank " + std::to_string(rank) + " receives " + megaplan::to_string(action) + " but is sent " +
                    megaplan::to_string(link.front());
        return false;
      }
      link.pop_front();
    }
    for (const Action& piece : pieces(action)) {
      if (!inputs_ready(piece)) return false;
    }
    if (is_send(action.kind)) {
      const Action receive = receive_for(action);
      links_[{static_cast<int64_t>(rank), rank_of(receive.stage)}].push_back(receive);
    }
    for (const Action& piece : pieces(action)) {
      for (const Fact& fact : facts_made_by(piece)) done_.insert(fact);
    }
    ++next_[rank];
    return true;
  }

  std::optional<std::string> run() {
    next_.assign(schedule_.ranks.size(), 0);
    for (bool progress = true; progress;) {
      progress = false;
      for (std::size_t rank = 0; rank < schedule_.ranks.size(); ++rank) {
        while (next_[rank] < schedule_.ranks[rank].size() && step(rank)) progress = true;
        if (mismatch_) return mismatch_;
      }
    }
    for (std::size_t rank = 0; rank < schedule_.ranks.size(); ++rank) {
      if (next_[rank] < schedule_.ranks[rank].size()) return "rank " + std::to_string(rank) + " never finishes";
    }
    return std::nullopt;
  }

  std::optional<std::string> missing_work() const {
    for (int64_t s = 0; s < shape_.num_stages; ++s) {
      for (int64_t m = 0; m < shape_.microbatches; ++m) {
        for (Made what : {Made::kForward, Made::kInputGradient, Made::kWeightGradient}) {
          if (!made(what, s, m)) {
            return "work of stage " + std::to_string(s) + " microbatch " + std::to_string(m) + " missing";
          }
        }
      }
    }
    return std::nullopt;
  }

  const PipelineSchedule& schedule_;
  const megaplan::ScheduleShape shape_;
  std::set<Fact> done_;
  std::map<std::pair<int64_t, int64_t>, std::deque<Action>> links_;  // (from rank, to rank): messages in flight
  std::vector<std::size_t> next_;
  std::optional<std::string> mismatch_;
};

// ---- agreement -------------------------------------------------------------------------------

std::string describe(const PipelineSchedule& schedule) {
  std::string text = schedule.lowered ? "lowered" : "compute only";
  for (std::size_t rank = 0; rank < schedule.ranks.size(); ++rank) {
    text += "\nrank " + std::to_string(rank) + ": " + megaplan::to_string(schedule.ranks[rank]);
  }
  return text;
}

// What is wrong with validate_schedule's verdict on `schedule`, or nothing: it must throw a
// one-line SpecError exactly when the brute-force run finds a `problem`, and nothing else.
std::optional<std::string> disagreement(const PipelineSchedule& schedule, const std::optional<std::string>& problem) {
  try {
    megaplan::validate_schedule(schedule);
    if (problem) return "validate_schedule passed, but the brute-force run finds: " + *problem;
  } catch (const megaplan::SpecError& error) {
    const std::string what = error.what();
    if (what.find('\n') != std::string::npos) return "a SpecError of several lines: " + what;
    if (!problem) return "validate_schedule refused a schedule that runs: " + what;
  } catch (const std::exception& error) {
    return "validate_schedule threw something other than a SpecError: " + std::string(error.what());
  }
  return std::nullopt;
}

// ---- mutations -------------------------------------------------------------------------------

int64_t uniform(std::mt19937& rng, int64_t low, int64_t high) {  // inclusive
  return std::uniform_int_distribution<int64_t>(low, high)(rng);
}

// An index into a container of `size` elements. REQUIRES: size > 0.
std::size_t pick(std::mt19937& rng, std::size_t size) {
  return static_cast<std::size_t>(uniform(rng, 0, static_cast<int64_t>(size) - 1));
}

// A stage or microbatch near `value`, or one just outside [0, limit).
int32_t nearby(std::mt19937& rng, int32_t value, int64_t limit) {
  const int64_t choice = uniform(rng, 0, 3);
  if (choice == 0) return static_cast<int32_t>(uniform(rng, -1, limit));
  return static_cast<int32_t>(choice == 1 ? value - 1 : value + 1);
}

// Changes the stage or the microbatch of one action (of either part of an OVERLAP_F_B); OPTIM and
// REDUCE_GRAD's missing microbatch stay as they are.
void renumber(std::mt19937& rng, Action& action, const megaplan::ScheduleShape& shape) {
  if (action.kind == ActionKind::kOptimizer) return;
  const bool backward_part = action.kind == ActionKind::kOverlapForwardBackward && uniform(rng, 0, 1) == 1;
  const bool stage = action.kind == ActionKind::kReduceGrad || uniform(rng, 0, 1) == 1;
  int32_t& field = stage ? (backward_part ? action.backward_stage : action.stage)
                         : (backward_part ? action.backward_microbatch : action.microbatch);
  field = nearby(rng, field, stage ? shape.num_stages : shape.microbatches);
}

// One random edit of one rank's list: swap, delete, duplicate, move (to any rank, its own
// included), renumber or truncate. Swaps favour neighbours, the edits most likely to keep a schedule nearly right.
void mutate(std::mt19937& rng, PipelineSchedule& schedule) {
  std::vector<Action>& actions = schedule.ranks[pick(rng, schedule.ranks.size())];
  if (actions.empty()) return;
  const std::size_t at = pick(rng, actions.size());
  switch (uniform(rng, 0, 6)) {
    case 0: {
      const bool neighbour = uniform(rng, 0, 1) == 0;
      const std::size_t other = neighbour ? std::min(at + 1, actions.size() - 1) : pick(rng, actions.size());
      std::swap(actions[at], actions[other]);
      break;
    }
    case 1: actions.erase(actions.begin() + static_cast<std::ptrdiff_t>(at)); break;
    case 2: {
      const Action copy = actions[at];
      actions.insert(actions.begin() + static_cast<std::ptrdiff_t>(pick(rng, actions.size() + 1)), copy);
      break;
    }
    case 3: {
      const Action moved = actions[at];
      actions.erase(actions.begin() + static_cast<std::ptrdiff_t>(at));
      std::vector<Action>& to = schedule.ranks[pick(rng, schedule.ranks.size())];
      to.insert(to.begin() + static_cast<std::ptrdiff_t>(pick(rng, to.size() + 1)), moved);
      break;
    }
    case 4:
    case 5: renumber(rng, actions[at], schedule.shape); break;
    default: actions.resize(at); break;
  }
}

struct Shape {
  ScheduleKind kind;
  int64_t pp, vpp, microbatches;
};

const std::vector<Shape>& shapes() {
  static const std::vector<Shape> all = {
      {ScheduleKind::kGPipe, 1, 1, 2},        {ScheduleKind::kGPipe, 3, 1, 3},
      {ScheduleKind::kOneFOneB, 2, 1, 1},     {ScheduleKind::kOneFOneB, 2, 1, 3},
      {ScheduleKind::kOneFOneB, 4, 1, 6},     {ScheduleKind::kInterleaved, 2, 2, 4},
      {ScheduleKind::kInterleaved, 3, 2, 6},  {ScheduleKind::kInterleaved, 2, 3, 2},
      {ScheduleKind::kZeroBubbleH1, 2, 1, 3}, {ScheduleKind::kZeroBubbleH1, 4, 1, 8},
      {ScheduleKind::kZeroBubbleV, 2, 2, 2},  {ScheduleKind::kZeroBubbleV, 3, 2, 5},
      {ScheduleKind::kDualPipeV, 2, 2, 4},    {ScheduleKind::kDualPipeV, 3, 2, 7},
  };
  return all;
}

// One to three mutations, mostly one: a single edit of a valid schedule is the subtle case.
PipelineSchedule mutated(std::mt19937& rng, const PipelineSchedule& schedule) {
  PipelineSchedule copy = schedule;
  const int64_t roll = uniform(rng, 0, 9);
  const int mutations = roll < 6 ? 1 : roll < 9 ? 2 : 3;
  for (int i = 0; i < mutations; ++i) mutate(rng, copy);
  return copy;
}

// ---- torch's CSV files -----------------------------------------------------------------------

const std::vector<std::string> kTorchCsvs = {"zb-h1-pp4-m8.csv",      "zb-h1-pp4-m8-comms.csv",
                                             "zbv-pp4-m8.csv",        "zbv-pp4-m8-comms.csv",
                                             "dualpipev-pp4-m10.csv", "dualpipev-pp4-m10-comms.csv"};

std::string torch_csv(const std::string& name) {
  return megaplan::read_text_file(std::string(MEGAPLAN_TEST_DATA_DIR) + "/torch_schedules/" + name);
}

using CsvRows = std::vector<std::vector<std::string>>;

CsvRows csv_cells(const std::string& text) {
  CsvRows rows;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = std::min(text.find("\r\n", start), text.size());  // a cut file's last row has none
    const std::string line = text.substr(start, end - start);
    std::vector<std::string>& cells = rows.emplace_back();
    for (std::size_t from = 0;;) {
      const std::size_t comma = line.find(',', from);
      cells.push_back(line.substr(from, comma - from));
      if (comma == std::string::npos) break;
      from = comma + 1;
    }
    start = end + 2;
  }
  return rows;
}

std::string csv_text(const CsvRows& rows) {  // as torch's csv.writer writes it
  std::string text;
  for (const auto& cells : rows) {
    for (std::size_t i = 0; i < cells.size(); ++i) text += (i > 0 ? "," : "") + cells[i];
    text += "\r\n";
  }
  return text;
}

// One random edit of the text: delete, duplicate or swap lines or cells, or cut the file short.
std::string mutated_csv(std::mt19937& rng, const std::string& text) {
  CsvRows rows = csv_cells(text);
  if (rows.empty()) return text;  // cut down to nothing already
  std::vector<std::string>& row = rows[pick(rng, rows.size())];
  std::vector<std::string>& other_row = rows[pick(rng, rows.size())];
  const std::size_t cell = pick(rng, row.size());
  switch (uniform(rng, 0, 6)) {
    case 0: rows.erase(rows.begin() + static_cast<std::ptrdiff_t>(pick(rng, rows.size()))); break;
    case 1: {
      const std::vector<std::string> copy = row;
      rows.insert(rows.begin() + static_cast<std::ptrdiff_t>(pick(rng, rows.size() + 1)), copy);
      break;
    }
    case 2: std::swap(row, other_row); break;
    case 3: row.erase(row.begin() + static_cast<std::ptrdiff_t>(cell)); break;
    case 4: {
      const std::string copy = row[cell];
      row.insert(row.begin() + static_cast<std::ptrdiff_t>(pick(rng, row.size() + 1)), copy);
      break;
    }
    case 5: std::swap(row[cell], other_row[pick(rng, other_row.size())]); break;
    default: {
      const std::string whole = csv_text(rows);
      return whole.substr(0, pick(rng, whole.size()));
    }
  }
  return csv_text(rows);
}

// The import `schedule --import F --check` runs: parse, then validate. Whatever it makes of `text`
// must be a one-line SpecError, or a schedule the brute-force run finds valid.
std::optional<std::string> import_disagreement(const std::string& text) {
  PipelineSchedule schedule;
  try {
    schedule = megaplan::parse_schedule_csv(text, "t.csv");
  } catch (const megaplan::SpecError& error) {
    if (std::string(error.what()).find('\n') == std::string::npos) return std::nullopt;
    return "a SpecError of several lines: " + std::string(error.what());
  } catch (const std::exception& error) {
    return "parse_schedule_csv threw something other than a SpecError: " + std::string(error.what());
  }
  return disagreement(schedule, BruteForceRun(schedule).problem());
}

}  // namespace

TEST_CASE("mutated schedules are refused with a SpecError exactly when a brute-force run fails",
          "[schedule][validation][property]") {
  std::mt19937 rng(20240611);
  std::size_t trials = 0;
  std::size_t passed = 0;
  for (const Shape& shape : shapes()) {
    const PipelineSchedule compute = megaplan::generate_schedule(shape.kind, shape.pp, shape.vpp, shape.microbatches);
    const PipelineSchedule lowered = megaplan::lower_schedule(compute);
    for (int trial = 0; trial < 300; ++trial) {
      for (const PipelineSchedule* original : {&compute, &lowered}) {
        const PipelineSchedule schedule = mutated(rng, *original);
        const std::optional<std::string> problem = BruteForceRun(schedule).problem();
        ++trials;
        if (const auto wrong = disagreement(schedule, problem)) {
          FAIL(megaplan::to_string(shape.kind) << ": " << *wrong << "\n" << describe(schedule));
        }
        if (schedule.lowered || problem) continue;
        // A mutated compute order that runs still lowers into one that runs.
        ++passed;
        const PipelineSchedule relowered = megaplan::lower_schedule(schedule);
        if (const auto wrong = disagreement(relowered, BruteForceRun(relowered).problem())) {
          FAIL("lowered: " << *wrong << "\n" << describe(relowered));
        }
      }
    }
  }
  CHECK(trials == shapes().size() * 600);
  CHECK(passed > 100);  // the property is not vacuous: many mutations keep a runnable compute order
}

TEST_CASE("mutated torch CSVs import as a valid schedule or fail with a one-line SpecError",
          "[schedule][csv][property]") {
  std::mt19937 rng(7);
  for (const std::string& name : kTorchCsvs) {
    const std::string original = torch_csv(name);
    REQUIRE(csv_text(csv_cells(original)) == original);  // the mutations start from torch's exact bytes
    for (int trial = 0; trial < 300; ++trial) {
      std::string text = original;
      const int64_t mutations = uniform(rng, 1, 2);
      for (int64_t i = 0; i < mutations; ++i) text = mutated_csv(rng, text);
      if (const auto wrong = import_disagreement(text)) FAIL(name << ": " << *wrong << "\n" << text);
    }
  }
}

TEST_CASE("a truncated torch CSV is refused unless it ends at a row of a one-stage-per-rank compute order",
          "[schedule][csv][property]") {
  for (const std::string& name : kTorchCsvs) {
    const std::string original = torch_csv(name);
    for (std::size_t size = 0; size < original.size(); ++size) {
      const std::string prefix = original.substr(0, size);
      if (const auto wrong = import_disagreement(prefix)) FAIL(name << " cut at " << size << ": " << *wrong);
      PipelineSchedule schedule;
      try {
        schedule = megaplan::parse_schedule_csv(prefix, name);
        megaplan::validate_schedule(schedule);
      } catch (const megaplan::SpecError&) {
        continue;
      }
      // Rows 0 .. k of a loop-placed compute order with one stage per rank are themselves a whole
      // pipeline of k + 1 ranks: nothing in the file tells the two apart.
      INFO(name << " cut at " << size << " passes");
      CHECK(prefix.ends_with("\r\n"));
      CHECK_FALSE(schedule.lowered);
      CHECK(schedule.shape.num_stages == schedule.shape.pipeline_parallel_size);
    }
  }
}
