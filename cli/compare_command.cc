// `megaplan compare`: flag mapping and the text and JSON reports.
#include "cli/compare_command.h"

#include <memory>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/text_file.h"
#include "core/units.h"
#include "reports/chrome_trace.h"
#include "reports/timeline_comparison.h"

namespace megaplan::cli {
namespace {

Timeline read_trace(const std::string& path, const std::string& flag) {
  std::string text;
  try {
    text = read_text_file(path);
  } catch (const SpecError& error) {
    throw SpecError(flag, error.what());  // "--measured: PATH: cannot read file: ..."
  }
  nlohmann::json trace;
  try {
    trace = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& error) {
    throw SpecError(flag, path + " is not JSON (byte " + std::to_string(error.byte) + ")");
  }
  return timeline_from_chrome_trace(trace, path);
}

nlohmann::json to_json(const CompareOptions& options, const TimelineComparison& comparison) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const RankComparison& rank : comparison.ranks) {
    nlohmann::json kinds = nlohmann::json::array();
    for (const KindComparison& kind : rank.kinds) {
      kinds.push_back({{"kind", action_kind_token(kind.kind)},
                       {"count", kind.count},
                       {"simulated_s", kind.simulated_s},
                       {"measured_s", kind.measured_s},
                       {"error", relative_error(kind.simulated_s, kind.measured_s)}});
    }
    ranks.push_back({{"pipeline_rank", rank.pipeline_rank},
                     {"simulated_span_s", rank.simulated_span_s},
                     {"measured_span_s", rank.measured_span_s},
                     {"same_compute_order", rank.same_compute_order},
                     {"kinds", std::move(kinds)}});
  }
  return {{"simulated", options.simulated},
          {"measured", options.measured},
          {"simulated_iteration_s", comparison.simulated_iteration_s},
          {"measured_iteration_s", comparison.measured_iteration_s},
          {"iteration_error", relative_error(comparison.simulated_iteration_s, comparison.measured_iteration_s)},
          {"ranks", std::move(ranks)}};
}

void write_text(const CompareOptions& options, const TimelineComparison& comparison, std::ostream& out) {
  out << "simulated  " << options.simulated << "\n"
      << "measured   " << options.measured << "\n"
      << "iteration  " << milliseconds_number(comparison.simulated_iteration_s) << " ms simulated, "
      << milliseconds_number(comparison.measured_iteration_s) << " ms measured: "
      << format_percent(relative_error(comparison.simulated_iteration_s, comparison.measured_iteration_s), true)
      << "\n";
  bool same_order = true;
  for (const RankComparison& rank : comparison.ranks) same_order = same_order && rank.same_compute_order;
  out << "order      "
      << (same_order ? "every rank computed in the simulated order"
                     : "some ranks computed in another order than simulated (see the table)")
      << "\n\n";
  out << comparison_table(comparison);
}

}  // namespace

int run_compare(const CompareOptions& options, std::ostream& out) {
  const Timeline simulated = read_trace(options.simulated, "--simulated");
  const Timeline measured = read_trace(options.measured, "--measured");
  const TimelineComparison comparison = compare_timelines(simulated, measured);
  if (options.json) {
    out << to_json(options, comparison).dump(2) << "\n";
  } else {
    write_text(options, comparison, out);
  }
  return 0;
}

void setup_compare_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<CompareOptions>();
  CLI::App* command = app.add_subcommand(
      "compare", "A simulated timeline against a measured one of the same plan, per rank and action kind");
  command->add_option("--simulated", options->simulated, "Chrome trace from simulate --trace")->required();
  command->add_option("--measured", options->measured, "Chrome trace from train --trace")->required();
  command->add_flag("--json", options->json, "Print JSON instead of text");
  command->callback([options, &context] { context.exit_code = run_compare(*options, context.out); });
}

}  // namespace megaplan::cli
