// `megaplan compare`'s outputs.
#include "reports/comparison_report.h"

#include "core/error.h"
#include "core/text_file.h"
#include "core/units.h"
#include "reports/chrome_trace.h"

namespace megaplan {

Timeline read_chrome_trace_file(const std::string& path, const std::string& flag) {
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

nlohmann::json comparison_json(const std::string& simulated, const std::string& measured,
                               const TimelineComparison& comparison) {
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
  return {{"simulated", simulated},
          {"measured", measured},
          {"simulated_iteration_s", comparison.simulated_iteration_s},
          {"measured_iteration_s", comparison.measured_iteration_s},
          {"iteration_error", relative_error(comparison.simulated_iteration_s, comparison.measured_iteration_s)},
          {"ranks", std::move(ranks)}};
}

void write_comparison_text(const std::string& simulated, const std::string& measured,
                           const TimelineComparison& comparison, std::ostream& out) {
  out << "simulated  " << simulated << "\n"
      << "measured   " << measured << "\n"
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

}  // namespace megaplan
