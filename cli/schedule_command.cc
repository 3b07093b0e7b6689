// `megaplan schedule`: generates a pipeline schedule (gpipe, 1f1b, interleaved, zb-h1, zbv,
// dualpipev), optionally lowered with sends, receives, REDUCE_GRAD and OPTIM, and prints it as a
// rank-by-rank listing with per-rank facts, as torch's CSV, or as JSON. With --import it reads a
// torch CSV instead; --check then only reports whether the schedule would run (no deadlock,
// matched messages, every F and backward once).
// Flag mapping, and the three output formats.
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/schedule/lowering.h"
#include "core/schedule/schedule_csv.h"
#include "core/schedule/schedule_traits.h"
#include "core/schedule/validation.h"
#include "core/text_file.h"
#include "executor/io/staged_file.h"
#include "reports/schedule_report.h"

namespace megaplan::cli {
namespace {

struct ScheduleOptions {
  std::string kind;            // required unless import_path is set
  int64_t pp = 0;              // required unless import_path is set
  int64_t microbatches = 0;    // required unless import_path is set
  std::optional<int64_t> vpp;  // default: 2 for zbv and dualpipev, else 1
  int64_t group_size = 0;      // interleaved only; 0 means pp
  bool lowered = false;
  std::string format = "text";  // text, csv or json
  std::string import_path;
  bool check = false;              // with import_path: print a verdict, not the schedule
  std::optional<std::string> out;  // write the output here (atomically) instead of `out`
};

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

// Throws SpecError for bad flags or a bad file, ScheduleError (with the marked grid) for a
// schedule that would hang or is incomplete. Returns the exit code (0).
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
    write_schedule_verdict(title, schedule, text);
  } else if (options.format == "csv") {
    text << schedule_to_csv(schedule);
  } else if (options.format == "json") {
    text << schedule_json(title, schedule).dump(2) << "\n";
  } else {
    write_schedule_text(title, schedule, text);
  }
  if (options.out) {
    exec::write_file_atomically(*options.out, text.str());
  } else {
    out << text.str();
  }
  return 0;
}

}  // namespace

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
