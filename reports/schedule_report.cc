#include "reports/schedule_report.h"

#include <string>
#include <vector>

#include "core/schedule/schedule_facts.h"
#include "core/text_table.h"

namespace megaplan {

namespace {

std::string placement_name(StagePlacement placement) { return placement == StagePlacement::kV ? "v" : "loop"; }

}  // namespace

std::string describe_schedule_shape(const PipelineSchedule& schedule) {
  const ScheduleShape& shape = schedule.shape;
  return "pp " + std::to_string(shape.pipeline_parallel_size) + ", " + std::to_string(shape.num_stages) + " stages (" +
         placement_name(shape.placement) + "), " + std::to_string(shape.microbatches) + " microbatches, " +
         (schedule.lowered ? "lowered" : "compute only");
}

void write_schedule_text(const std::string& title, const PipelineSchedule& schedule, std::ostream& out) {
  out << title << ": " << describe_schedule_shape(schedule) << "\n";
  for (std::size_t rank = 0; rank < schedule.ranks.size(); ++rank) {
    out << "rank " << rank << ": " << to_string(schedule.ranks[rank]) << "\n";
  }
  TextTable table({"rank", "actions", "compute", "peak in-flight", "sends", "receives"});
  const std::vector<RankScheduleFacts> facts = schedule_facts(schedule);
  for (std::size_t rank = 0; rank < facts.size(); ++rank) {
    table.add_row({std::to_string(rank), std::to_string(schedule.ranks[rank].size()),
                   std::to_string(facts[rank].compute_actions), std::to_string(facts[rank].peak_inflight_microbatches),
                   std::to_string(facts[rank].sends), std::to_string(facts[rank].receives)});
  }
  out << "\n" << table.render();
}

nlohmann::json schedule_json(const std::string& title, const PipelineSchedule& schedule) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const std::vector<Action>& actions : schedule.ranks) {
    nlohmann::json row = nlohmann::json::array();
    for (const Action& action : actions) row.push_back(to_string(action));
    ranks.push_back(std::move(row));
  }
  nlohmann::json facts = nlohmann::json::array();
  for (const RankScheduleFacts& rank : schedule_facts(schedule)) {
    facts.push_back({{"compute_actions", rank.compute_actions},
                     {"peak_inflight_microbatches", rank.peak_inflight_microbatches},
                     {"sends", rank.sends},
                     {"receives", rank.receives}});
  }
  return {{"schedule", title},
          {"pipeline_parallel_size", schedule.shape.pipeline_parallel_size},
          {"num_stages", schedule.shape.num_stages},
          {"placement", placement_name(schedule.shape.placement)},
          {"microbatches", schedule.shape.microbatches},
          {"lowered", schedule.lowered},
          {"ranks", std::move(ranks)},
          {"facts", std::move(facts)}};
}

void write_schedule_verdict(const std::string& title, const PipelineSchedule& schedule, std::ostream& out) {
  std::size_t actions = 0;
  for (const auto& rank : schedule.ranks) actions += rank.size();
  out << "ok: " << title << ": " << describe_schedule_shape(schedule) << "; " << actions
      << " actions run without deadlock, messages match in order, every F and backward once\n";
}

}  // namespace megaplan
