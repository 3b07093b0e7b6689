// `megaplan compare`: flag mapping and the text and JSON reports.
#include "cli/compare_command.h"

#include <memory>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/text_file.h"
#include "reports/chrome_trace.h"
#include "reports/text_table.h"
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

std::string milliseconds(double seconds) {
  std::ostringstream text;
  text.setf(std::ios::fixed);
  text.precision(3);
  text << seconds * 1e3;
  return text.str();
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
      << "iteration  " << milliseconds(comparison.simulated_iteration_s) << " ms simulated, "
      << milliseconds(comparison.measured_iteration_s) << " ms measured: "
      << format_percent(relative_error(comparison.simulated_iteration_s, comparison.measured_iteration_s), true) << "\n";
  bool same_order = true;
  for (const RankComparison& rank : comparison.ranks) same_order = same_order && rank.same_compute_order;
  out << "order      " << (same_order ? "every rank computed in the simulated order"
                                      : "some ranks computed in another order than simulated (see the table)")
      << "\n\n";
  TextTable table({"rank", "action", "count", "simulated ms/action", "measured ms/action", "error", "order"});
  for (const RankComparison& rank : comparison.ranks) {
    for (const KindComparison& kind : rank.kinds) {
      const double count = static_cast<double>(kind.count);
      table.add_row({std::to_string(rank.pipeline_rank), action_kind_token(kind.kind), std::to_string(kind.count),
                     milliseconds(kind.simulated_s / count), milliseconds(kind.measured_s / count),
                     format_percent(relative_error(kind.simulated_s, kind.measured_s), true),
                     rank.same_compute_order ? "same" : "differs"});
    }
    table.add_row({std::to_string(rank.pipeline_rank), "span", "1", milliseconds(rank.simulated_span_s),
                   milliseconds(rank.measured_span_s),
                   format_percent(relative_error(rank.simulated_span_s, rank.measured_span_s), true),
                   rank.same_compute_order ? "same" : "differs"});
  }
  out << table.render();
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
