// `megaplan compare`'s parts: a trace read back into the timeline it was written from, and a
// simulated timeline against a "measured" one made from it with known differences.
#include <catch2/catch.hpp>

#include <string>

#include "core/error.h"
#include "reports/chrome_trace.h"
#include "reports/timeline_comparison.h"
#include "simulated_pipeline.h"

namespace {

using megaplan::ActionKind;
using megaplan::Timeline;
using megaplan::TimelineSlice;

// A 1F1B pipeline of 2 ranks and 4 microbatches.
Timeline simulated_timeline() {
  Timeline timeline = megaplan::test::simulated_1f1b(4).result.timeline;
  timeline.source = "simulated.json";
  return timeline;
}

}  // namespace

TEST_CASE("a Chrome trace reads back into the timeline it was written from", "[reports][trace]") {
  const Timeline written = simulated_timeline();
  const Timeline read = megaplan::timeline_from_chrome_trace(
      nlohmann::json::parse(megaplan::timeline_to_chrome_trace(written).dump()), "t.json");
  REQUIRE(read.slices.size() == written.slices.size());
  for (std::size_t i = 0; i < read.slices.size(); ++i) {
    INFO(megaplan::to_string(written.slices[i].action));
    CHECK(read.slices[i].action == written.slices[i].action);
    CHECK(read.slices[i].pipeline_rank == written.slices[i].pipeline_rank);
    CHECK(read.slices[i].stream == written.slices[i].stream);
    CHECK(read.slices[i].start_s == Approx(written.slices[i].start_s).margin(1e-12));
    CHECK(read.slices[i].end_s == Approx(written.slices[i].end_s).margin(1e-12));
  }
}

TEST_CASE("a trace that is not megaplan's timeline gets one line naming the event", "[reports][trace]") {
  const auto read = [](const std::string& text) {
    return megaplan::timeline_from_chrome_trace(nlohmann::json::parse(text), "m.json");
  };
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(read(R"({"events": []})"), Contains("m.json: not a Chrome trace"));
  CHECK_THROWS_WITH(read(R"({"traceEvents": [{"ph": "X", "name": "0Q1", "pid": 0, "tid": 0, "ts": 0, "dur": 1}]})"),
                    Contains("m.json: traceEvents[0]: name"));
  CHECK_THROWS_WITH(read(R"({"traceEvents": [{"ph": "M", "name": "process_name", "pid": 0},
                                             {"ph": "X", "name": "0F1", "pid": 0, "tid": 1, "ts": 0, "dur": 1}]})"),
                    Contains("m.json: traceEvents[1]: tid: is 1, but 0F1 runs on the compute stream (0)"));
  CHECK_THROWS_WITH(read(R"({"traceEvents": [{"ph": "X", "name": "0F1", "pid": 0, "tid": 0, "ts": -5, "dur": 1}]})"),
                    Contains("m.json: traceEvents[0]: ts: must be a finite number >= 0"));
  CHECK_THROWS_WITH(read(R"({"traceEvents": [{"ph": "X", "name": "0F1", "tid": 0, "ts": 0, "dur": 1}]})"),
                    Contains("m.json: traceEvents[0]: pid: missing"));
}

TEST_CASE("comparing timelines: per kind, per rank, the iteration and the compute order", "[reports][compare]") {
  const Timeline simulated = simulated_timeline();
  // Measured: everything twice as long and twice as late, so every error is -50%.
  Timeline measured = simulated;
  measured.source = "measured.json";
  for (TimelineSlice& slice : measured.slices) {
    slice.start_s *= 2;
    slice.end_s *= 2;
  }
  megaplan::TimelineComparison comparison = megaplan::compare_timelines(simulated, measured);
  REQUIRE(comparison.ranks.size() == 2);
  CHECK(megaplan::relative_error(comparison.simulated_iteration_s, comparison.measured_iteration_s) == Approx(-0.5));
  for (const megaplan::RankComparison& rank : comparison.ranks) {
    INFO("rank " << rank.pipeline_rank);
    CHECK(rank.same_compute_order);
    CHECK(rank.measured_span_s == Approx(2 * rank.simulated_span_s));
    bool saw_forward = false;
    for (const megaplan::KindComparison& kind : rank.kinds) {
      INFO(megaplan::action_kind_token(kind.kind));
      if (kind.simulated_s > 0) CHECK(megaplan::relative_error(kind.simulated_s, kind.measured_s) == Approx(-0.5));
      if (kind.kind == ActionKind::kForward) {
        saw_forward = true;
        CHECK(kind.count == 4);
        CHECK(kind.simulated_s == Approx(4e-3));
      }
    }
    CHECK(saw_forward);
  }

  // Rank 1 runs its first two computations the other way round: the order differs there only.
  std::vector<TimelineSlice*> rank1_compute;
  for (TimelineSlice& slice : measured.slices) {
    if (slice.pipeline_rank == 1 && slice.stream == megaplan::TimelineStream::kCompute) rank1_compute.push_back(&slice);
  }
  REQUIRE(rank1_compute.size() >= 2);
  std::swap(rank1_compute[0]->start_s, rank1_compute[1]->start_s);
  comparison = megaplan::compare_timelines(simulated, measured);
  CHECK(comparison.ranks[0].same_compute_order);
  CHECK_FALSE(comparison.ranks[1].same_compute_order);

  // Another plan's trace: one line naming an action only one of them holds.
  measured.slices.pop_back();
  CHECK_THROWS_AS(megaplan::compare_timelines(simulated, measured), megaplan::SpecError);
  CHECK_THROWS_WITH(megaplan::compare_timelines(simulated, measured),
                    Catch::Matchers::Contains("--measured: measured.json lacks"));
}
