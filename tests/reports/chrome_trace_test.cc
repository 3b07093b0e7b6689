// A simulated timeline becomes a trace Perfetto loads: one slice per action, named as the action.
#include <catch2/catch.hpp>

#include <map>

#include "core/model_presets.h"
#include "reports/chrome_trace.h"
#include "simulated_pipeline.h"

TEST_CASE("the trace parses and has one slice per action, on named tracks", "[reports][trace]") {
  const megaplan::test::SimulatedPipeline pipeline = megaplan::test::simulated_1f1b(3);
  const megaplan::PipelineSchedule& schedule = pipeline.schedule;
  const auto& result = pipeline.result;
  const nlohmann::json trace = nlohmann::json::parse(megaplan::timeline_to_chrome_trace(result.timeline).dump());

  std::size_t actions = 0;
  for (const auto& rank : schedule.ranks) actions += rank.size();
  std::map<std::string, int> slices_named;
  std::size_t slices = 0;
  std::size_t thread_names = 0;
  for (const nlohmann::json& event : trace.at("traceEvents")) {
    if (event.at("ph") == "X") {
      ++slices;
      ++slices_named[event.at("name").get<std::string>()];
      CHECK(event.at("dur").get<double>() >= 0);
    } else if (event.at("name") == "thread_name") {
      ++thread_names;
    }
  }
  CHECK(slices == actions);
  CHECK(slices_named["0F0"] == 1);
  CHECK(slices_named["1B2"] == 1);
  CHECK(slices_named["1RECV_F2"] == 1);
  CHECK(slices_named["OPTIM"] == 2);
  CHECK(thread_names == 2 * 4);  // compute, send, receive and data-parallel on both ranks
  // The first forward starts at 0 and lasts 1 ms = 1000 us.
  for (const nlohmann::json& event : trace.at("traceEvents")) {
    if (event.value("name", "") == "0F0") {
      CHECK(event.at("ts").get<double>() == Approx(0));
      CHECK(event.at("dur").get<double>() == Approx(1000));
    }
  }
}

TEST_CASE("the trace's slices carry their microbatch, stage and layers; flows join each send to its receive",
          "[reports][trace]") {
  const megaplan::test::SimulatedPipeline pipeline = megaplan::test::simulated_1f1b(4);
  megaplan::JobSpec job;
  job.model = megaplan::model_preset("gpt2-124m");
  job.plan.pipeline_parallel_size = 2;
  job.plan.micro_batch_size = 1;
  job.plan.global_batch_size = 4;
  const nlohmann::json trace = megaplan::timeline_to_chrome_trace(pipeline.result.timeline, job);
  std::map<int64_t, std::pair<nlohmann::json, nlohmann::json>> flows;  // id -> (start, finish)
  for (const nlohmann::json& event : trace.at("traceEvents")) {
    const std::string phase = event.at("ph");
    if (phase == "X" && event.at("name") == "1F2") {
      CHECK(event.at("args") == nlohmann::json{{"virtual_stage", 1}, {"microbatch", 2}, {"layers", "6-11"}});
    }
    if (phase == "s") flows[event.at("id").get<int64_t>()].first = event;
    if (phase == "f") flows[event.at("id").get<int64_t>()].second = event;
  }
  REQUIRE(flows.size() == 8);  // 4 forward sends from stage 0, 4 backward sends from stage 1
  for (const auto& [id, ends] : flows) {
    CHECK(ends.first.at("pid") != ends.second.at("pid"));  // between the two pipeline ranks
    CHECK(ends.second.at("ts").get<double>() >= ends.first.at("ts").get<double>());
  }
  CHECK(trace.at("otherData").at("model") == "gpt2-124m");
  CHECK(trace.at("otherData").at("plan") == "tp 1, pp 2, cp 1, dp 1, vpp 1, mbs 1, gbs 4, 1f1b");
  // Flows and args change nothing the reader takes back.
  CHECK(megaplan::timeline_from_chrome_trace(trace, "t.json").slices.size() == pipeline.result.timeline.slices.size());
}
