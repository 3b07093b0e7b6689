// `megaplan schedule`: flag mapping, and the three output formats.
#include "cli/schedule_command.h"

#include <memory>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/schedule/lowering.h"
#include "core/schedule/schedule_csv.h"
#include "core/schedule/schedule_facts.h"
#include "core/schedule/schedule_traits.h"
#include "core/schedule/validation.h"
#include "core/text_file.h"
#include "executor/io/staged_file.h"
#include "reports/text_table.h"

namespace megaplan::cli {
namespace {

std::string placement_name(StagePlacement placement) { return placement == StagePlacement::kV ? "v" : "loop"; }

std::string describe_shape(const PipelineSchedule& schedule) {
  const ScheduleShape& shape = schedule.shape;
  return "pp " + std::to_string(shape.pipeline_parallel_size) + ", " + std::to_string(shape.num_stages) + " stages (" +
         placement_name(shape.placement) + "), " + std::to_string(shape.microbatches) + " microbatches, " +
         (schedule.lowered ? "lowered" : "compute only");
}

PipelineSchedule generated(const ScheduleOptions& options) {
  if (options.kind.empty()) throw SpecError("--kind", "required unless --import is given");
  if (options.pp == 0) throw SpecError("--pp", "required unless --import is given");
  if (options.microbatches == 0) throw SpecError("--microbatches", "required unless --import is given");
  const ScheduleKind kind = parse_schedule_kind(options.kind, "--kind");
  const int64_t vpp = options.vpp.value_or(default_virtual_pipeline_size(kind));
  if (options.group_size != 0 && kind != ScheduleKind::kInterleaved) {
    throw SpecError("--microbatch-group-size", "applies to the interleaved schedule only, not " + options.kind);
  }
  return generate_schedule(kind, options.pp, vpp, options.microbatches, options.group_size);
}

void write_text(const std::string& title, const PipelineSchedule& schedule, std::ostream& out) {
  out << title << ": " << describe_shape(schedule) << "\n";
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

nlohmann::json to_json(const std::string& title, const PipelineSchedule& schedule) {
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

}  // namespace

int run_schedule(const ScheduleOptions& options, std::ostream& out) {
  if (options.format != "text" && options.format != "csv" && options.format != "json") {
    throw SpecError("--format", "must be one of text, csv, json; got \"" + options.format + "\"");
  }
  if (options.check && options.import_path.empty()) throw SpecError("--check", "needs --import FILE");
  const bool imported = !options.import_path.empty();
  PipelineSchedule schedule =
      imported ? parse_schedule_csv(read_text_file(options.import_path), options.import_path) : generated(options);
  const std::string title = imported ? options.import_path : options.kind;
  validate_schedule(schedule);
  if (options.lowered && !schedule.lowered) {
    schedule = lower_schedule(schedule);
    validate_schedule(schedule);
  }

  std::ostringstream text;
  if (options.check) {
    std::size_t actions = 0;
    for (const auto& rank : schedule.ranks) actions += rank.size();
    text << "ok: " << title << ": " << describe_shape(schedule) << "; " << actions
         << " actions run without deadlock, messages match in order, every F and backward once\n";
  } else if (options.format == "csv") {
    text << schedule_to_csv(schedule);
  } else if (options.format == "json") {
    text << to_json(title, schedule).dump(2) << "\n";
  } else {
    write_text(title, schedule, text);
  }
  if (options.out) {
    exec::write_file_atomically(*options.out, text.str());
  } else {
    out << text.str();
  }
  return 0;
}

void setup_schedule_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<ScheduleOptions>();
  CLI::App* command = app.add_subcommand(
      "schedule", "Generate, lower, check or convert a pipeline schedule (torch.distributed.pipelining's CSV)");
  CLI::Option* kind = command->add_option("--kind", options->kind, "gpipe, 1f1b, interleaved, zb-h1, zbv or dualpipev");
  CLI::Option* pp = command->add_option("--pp,--pipeline-model-parallel-size", options->pp, "Pipeline ranks");
  CLI::Option* microbatches =
      command->add_option("--microbatches", options->microbatches, "Microbatches per iteration");
  CLI::Option* vpp = command->add_option("--vpp,--virtual-pipeline-model-parallel-size", options->vpp,
                                         "Stages per rank (default: 2 for zbv and dualpipev, else 1)");
  CLI::Option* group = command->add_option("--microbatch-group-size", options->group_size,
                                           "Megatron's microbatch_group_size_per_vp_stage (interleaved; default pp)");
  command->add_flag("--lowered", options->lowered, "Insert sends, receives, REDUCE_GRAD and OPTIM");
  command->add_option("--format", options->format, "text, csv (torch's) or json")->capture_default_str();
  CLI::Option* import = command->add_option("--import", options->import_path, "Read a torch schedule CSV instead");
  command->add_flag("--check", options->check, "With --import: only say whether the schedule would run");
  command->add_option("--out", options->out, "Write the output to this file (atomically)");
  for (CLI::Option* generator_flag : {kind, pp, microbatches, vpp, group}) import->excludes(generator_flag);
  command->callback([options, &context] { context.exit_code = run_schedule(*options, context.out); });
}

}  // namespace megaplan::cli
