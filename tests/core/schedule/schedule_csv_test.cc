// torch's schedule CSVs: megaplan's output round-trips, torch's own files (bubbles, comms) import,
// and broken files are refused with the file, row and column.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "core/schedule/lowering.h"
#include "core/schedule/schedule_csv.h"
#include "core/schedule/validation.h"
#include "core/text_file.h"

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using megaplan::ScheduleKind;

namespace {

std::string torch_csv(const std::string& name) {
  return megaplan::read_text_file(std::string(MEGAPLAN_TEST_DATA_DIR) + "/torch_schedules/" + name);
}

}  // namespace

TEST_CASE("generated schedules round-trip through CSV, compute-only and lowered", "[schedule][csv]") {
  for (const auto& [kind, vpp, microbatches] :
       {std::tuple{ScheduleKind::kOneFOneB, 1, 8}, std::tuple{ScheduleKind::kInterleaved, 2, 8},
        std::tuple{ScheduleKind::kZeroBubbleV, 2, 8}, std::tuple{ScheduleKind::kDualPipeV, 2, 10}}) {
    INFO(megaplan::to_string(kind));
    const megaplan::PipelineSchedule compute = megaplan::generate_schedule(kind, 4, vpp, microbatches);
    for (const megaplan::PipelineSchedule& schedule : {compute, megaplan::lower_schedule(compute)}) {
      const std::string csv = megaplan::schedule_to_csv(schedule);
      CHECK(csv.find(",,") == std::string::npos);
      const megaplan::PipelineSchedule parsed = megaplan::parse_schedule_csv(csv, "t.csv");
      CHECK(parsed.ranks == schedule.ranks);
      CHECK(parsed.lowered == schedule.lowered);
      CHECK(parsed.shape.pipeline_parallel_size == 4);
      CHECK(parsed.shape.num_stages == 4 * vpp);
      CHECK(parsed.shape.microbatches == microbatches);
      CHECK(parsed.shape.placement == schedule.shape.placement);
    }
  }
}

TEST_CASE("torch's own CSVs import: idle cells skipped, comms detected, and they validate", "[schedule][csv]") {
  const megaplan::PipelineSchedule zbv = megaplan::parse_schedule_csv(torch_csv("zbv-pp4-m8.csv"), "zbv.csv");
  CHECK_FALSE(zbv.lowered);
  CHECK(zbv.shape.placement == megaplan::StagePlacement::kV);
  CHECK(zbv.ranks == megaplan::generate_schedule(ScheduleKind::kZeroBubbleV, 4, 2, 8).ranks);
  CHECK_NOTHROW(megaplan::validate_schedule(zbv));
  for (const char* name : {"zbv-pp4-m8-comms.csv", "dualpipev-pp4-m10-comms.csv", "zb-h1-pp4-m8-comms.csv"}) {
    INFO(name);
    const megaplan::PipelineSchedule lowered = megaplan::parse_schedule_csv(torch_csv(name), name);
    CHECK(lowered.lowered);
    CHECK_NOTHROW(megaplan::validate_schedule(lowered));
  }
  const megaplan::PipelineSchedule zb_h1 = megaplan::parse_schedule_csv(torch_csv("zb-h1-pp4-m8.csv"), "zb.csv");
  CHECK(zb_h1.shape.placement == megaplan::StagePlacement::kLoop);
  CHECK(zb_h1.ranks == megaplan::generate_schedule(ScheduleKind::kZeroBubbleH1, 4, 1, 8).ranks);
}

TEST_CASE("broken CSVs are refused with the file, row and column or the rule", "[schedule][csv]") {
  CHECK_THROWS_WITH(megaplan::parse_schedule_csv("0F0,0B0\n1F0,1X0,1B0\n", "s.csv"),
                    "s.csv:2:2: unknown action \"1X0\"");
  CHECK_THROWS_WITH(megaplan::parse_schedule_csv("\n\n", "s.csv"), Contains("s.csv: holds no actions"));
  CHECK_THROWS_WITH(megaplan::parse_schedule_csv("0F0,0B0\n0F1,0B1\n", "s.csv"),
                    "s.csv: stage 0 appears on rank 0 and rank 1 (0F1)");
  CHECK_THROWS_WITH(megaplan::parse_schedule_csv("0F0,0B0,2F0,2B0\n1F0,1B0\n", "s.csv"),
                    Contains("gives 3 stages, not a multiple of the 2 rows"));
  CHECK_NOTHROW(megaplan::parse_schedule_csv("0F0,3F0,3B0,0B0\n1F0,2F0,2B0,1B0\n", "v.csv"));
  CHECK_THROWS_WITH(megaplan::parse_schedule_csv("0F0,1F0,1B0,0B0\n2F0,3F0,3B0,2B0\n", "s.csv"),
                    "s.csv: stages are placed neither \"loop\" (stage s on rank s % 2) nor \"v\" (rank r runs stages r "
                    "and 3 - r)");
  // Cut short: inside the last row, or after whole rows whose stages the rows left still name.
  CHECK_THROWS_WITH(megaplan::parse_schedule_csv("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B", "s.csv"),
                    "s.csv:2: the last row has no line ending: the file is cut short (torch and megaplan end every row "
                    "with a newline)");
  CHECK_THROWS_WITH(megaplan::parse_schedule_csv("0F0,0SEND_F0,0RECV_B0,0B0\r\n", "s.csv"),
                    "s.csv: no row runs stage 1, though 0SEND_F0 (row 1) names stage 1: a pipeline rank's row is "
                    "missing, or the file is cut short");
  CHECK_THROWS_WITH(megaplan::parse_schedule_csv("0F0,3F0,3B0,0B0\n", "s.csv"),
                    StartsWith("s.csv: no row runs stage 1, though 3F0 (row 1) names stage 3"));
  CHECK_THROWS_WITH(megaplan::parse_schedule_csv("999999999F0\n", "s.csv"), StartsWith("s.csv: no row runs stage 0"));
  // A missing backward and a duplicate forward parse, and validation names them.
  const auto missing = megaplan::parse_schedule_csv("0F0,0F1,0B0\n1F0,1B0,1F1,1B1\n", "s.csv");
  CHECK_THROWS_WITH(megaplan::validate_schedule(missing),
                    "schedule: incomplete: no rank runs 0B1 (a B, or an I and a W)");
  const auto duplicate = megaplan::parse_schedule_csv("0F0,0F0,0B0\n1F0,1B0\n", "s.csv");
  CHECK_THROWS_WITH(megaplan::validate_schedule(duplicate), Contains("duplicate: 0F0 (rank 0, step 1)"));
}
