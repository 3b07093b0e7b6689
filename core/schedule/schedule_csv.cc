// Schedule CSV reading and writing.
#include "core/schedule/schedule_csv.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "core/input_limits.h"
#include "core/parallel_plan.h"
#include "core/pipeline_layout.h"
#include "core/schedule/dependencies.h"
#include "core/text_file.h"

namespace megaplan {

namespace {

bool is_communication(ActionKind kind) {
  switch (kind) {
    case ActionKind::kSendForward:
    case ActionKind::kRecvForward:
    case ActionKind::kSendBackward:
    case ActionKind::kRecvBackward:
    case ActionKind::kReduceGrad:
    case ActionKind::kOptimizer: return true;
    default: return false;
  }
}

// Cells of one line; a cell may be wrapped in double quotes (csv writers quote some values).
std::vector<std::string> split_cells(const std::string& line) {
  std::vector<std::string> cells;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = line.find(',', start);
    std::string cell = line.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const auto first = cell.find_first_not_of(" \t");
    const auto last = cell.find_last_not_of(" \t");
    cell = first == std::string::npos ? "" : cell.substr(first, last - first + 1);
    if (cell.size() >= 2 && cell.front() == '"' && cell.back() == '"') cell = cell.substr(1, cell.size() - 2);
    cells.push_back(cell);
    if (comma == std::string::npos) return cells;
    start = comma + 1;
  }
}

// One action list per line. Every line must end in a newline: torch's csv.writer ends each row
// with "\r\n" and schedule_to_csv with "\n", so a last row without one is a file cut short, whose
// last action may itself be cut ("0F12" read as "0F1").
std::vector<std::vector<Action>> parse_rows(const std::string& text, const std::string& source) {
  std::vector<std::vector<Action>> rows;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = text.find('\n', start);
    const std::string row = std::to_string(rows.size() + 1);
    if (end == std::string::npos) {
      throw SpecError(source + ":" + row,
                      "the last row has no line ending: the file is cut short (torch and "
                      "megaplan end every row with a newline)");
    }
    std::string line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    start = end + 1;
    std::vector<Action>& actions = rows.emplace_back();
    const std::vector<std::string> cells = split_cells(line);
    for (std::size_t column = 0; column < cells.size(); ++column) {
      if (cells[column].empty()) continue;  // torch's idle step
      actions.push_back(parse_action(cells[column], source + ":" + row + ":" + std::to_string(column + 1)));
    }
  }
  return rows;
}

// The row (pipeline rank) of every stage from 0 to the highest any action names, a message's peer
// stage included. Throws when two rows run one stage, or when no row runs a stage: every stage
// runs forwards, so a row is missing — most often the file's last rows, cut off at a row's end
// (the rows left still name the lost rows' stages: a V's or an interleaved loop's later stages,
// or a lowered row's sends to the next rank).
std::vector<int64_t> rows_of_stages(const std::vector<std::vector<Action>>& ranks, const std::string& source) {
  std::map<int64_t, int64_t> row_of;  // sparse: a stage number may be as large as 10^9
  int64_t highest = -1;
  std::string highest_named_by;
  for (std::size_t rank = 0; rank < ranks.size(); ++rank) {
    for (const Action& action : ranks[rank]) {
      if (action.kind == ActionKind::kOptimizer) continue;
      for (const Action& part : parts_of(action)) {
        const auto [placed, inserted] = row_of.emplace(part.stage, rank);
        if (!inserted && placed->second != static_cast<int64_t>(rank)) {
          throw SpecError(source, "stage " + std::to_string(part.stage) + " appears on rank " +
                                      std::to_string(placed->second) + " and rank " + std::to_string(rank) + " (" +
                                      to_string(action) + ")");
        }
        const int64_t named =
            is_message(part.kind) ? std::max<int64_t>(part.stage, message_peer_stage(part)) : part.stage;
        if (named > highest) {
          highest = named;
          highest_named_by = to_string(action) + " (row " + std::to_string(rank + 1) + ")";
        }
      }
    }
  }
  std::vector<int64_t> rows;
  for (const auto& [stage, row] : row_of) {
    if (stage != static_cast<int64_t>(rows.size())) break;
    rows.push_back(row);
  }
  if (static_cast<int64_t>(rows.size()) <= highest) {
    throw SpecError(source, "no row runs stage " + std::to_string(rows.size()) + ", though " + highest_named_by +
                                " names stage " + std::to_string(highest) +
                                ": a pipeline rank's row is missing, or the file is cut short");
  }
  return rows;
}

// The placement every stage agrees with, among "loop" and "v".
StagePlacement infer_placement(const std::vector<int64_t>& rank_of_stage, int64_t pp, const std::string& source) {
  const auto num_stages = static_cast<int64_t>(rank_of_stage.size());
  for (StagePlacement placement : {StagePlacement::kLoop, StagePlacement::kV}) {
    if (placement == StagePlacement::kV && num_stages != 2 * pp) continue;
    bool agrees = true;
    for (int64_t stage = 0; stage < num_stages && agrees; ++stage) {
      agrees = rank_of_stage[static_cast<std::size_t>(stage)] == pipeline_rank_of_stage(stage, pp, placement);
    }
    if (agrees) return placement;
  }
  throw SpecError(source, "stages are placed neither \"loop\" (stage s on rank s % " + std::to_string(pp) +
                              ") nor \"v\" (rank r runs stages r and " + std::to_string(2 * pp - 1) + " - r)");
}

}  // namespace

std::string schedule_to_csv(const PipelineSchedule& schedule) {
  std::string text;
  for (const std::vector<Action>& actions : schedule.ranks) {
    for (std::size_t i = 0; i < actions.size(); ++i) text += (i > 0 ? "," : "") + to_string(actions[i]);
    text += '\n';
  }
  return text;
}

PipelineSchedule parse_schedule_csv(const std::string& text, const std::string& source) {
  PipelineSchedule schedule;
  schedule.ranks = parse_rows(text, source);
  while (!schedule.ranks.empty() && schedule.ranks.back().empty()) schedule.ranks.pop_back();
  if (schedule.ranks.empty()) throw SpecError(source, "holds no actions; expected one row per pipeline rank");

  const auto pp = static_cast<int64_t>(schedule.ranks.size());
  int64_t max_microbatch = -1;
  for (const auto& actions : schedule.ranks) {
    for (const Action& action : actions) {
      schedule.lowered = schedule.lowered || is_communication(action.kind);
      if (action.kind == ActionKind::kOptimizer) continue;
      for (const Action& part : parts_of(action)) max_microbatch = std::max<int64_t>(max_microbatch, part.microbatch);
    }
  }
  if (max_microbatch < 0) throw SpecError(source, "holds no compute actions (F, B, I, W)");
  require_at_most(static_cast<int64_t>(schedule.ranks.size()), kMaxPipelineStages, source + ": rows (pipeline ranks)");
  require_at_most(max_microbatch + 1, kMaxMicrobatches, source + ": microbatches (the highest microbatch + 1)");
  const std::vector<int64_t> rank_of_stage = rows_of_stages(schedule.ranks, source);
  const auto num_stages = static_cast<int64_t>(rank_of_stage.size());
  require_schedule_size(num_stages, max_microbatch + 1, source + ": stages", source + ": microbatches");
  if (num_stages % pp != 0) {
    throw SpecError(source, "highest stage " + std::to_string(num_stages - 1) + " gives " + std::to_string(num_stages) +
                                " stages, not a multiple of the " + std::to_string(pp) + " rows (pipeline ranks)");
  }
  schedule.shape.pipeline_parallel_size = pp;
  schedule.shape.num_stages = num_stages;
  schedule.shape.microbatches = max_microbatch + 1;
  schedule.shape.placement = infer_placement(rank_of_stage, pp, source);
  return schedule;
}

PipelineSchedule read_plan_schedule_csv(const std::string& path, const ParallelPlan& plan, const std::string& flag) {
  PipelineSchedule schedule = parse_schedule_csv(read_text_file(path), path);
  if (schedule.lowered) {
    throw SpecError(
        flag, path + " holds sends and receives; give the compute-only schedule (megaplan places the communication)");
  }
  const ScheduleShape& shape = schedule.shape;
  const auto mismatch = [&](const std::string& what, int64_t file, int64_t wanted) {
    throw SpecError(flag, path + " has " + std::to_string(file) + " " + what + ", the plan " + std::to_string(wanted));
  };
  if (shape.pipeline_parallel_size != plan.pipeline_parallel_size) {
    mismatch("pipeline ranks", shape.pipeline_parallel_size, plan.pipeline_parallel_size);
  }
  if (shape.num_stages != plan.num_virtual_stages()) mismatch("stages", shape.num_stages, plan.num_virtual_stages());
  if (shape.microbatches != plan.num_microbatches())
    mismatch("microbatches", shape.microbatches, plan.num_microbatches());
  if (shape.placement != stage_placement(plan.schedule)) {
    throw SpecError(flag, path + " places stages " + (shape.placement == StagePlacement::kV ? "in a V" : "in a loop") +
                              " but --schedule " + to_string(plan.schedule) + " does not");
  }
  return schedule;
}

}  // namespace megaplan
