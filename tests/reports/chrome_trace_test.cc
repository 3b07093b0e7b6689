// A simulated timeline becomes a trace Perfetto loads: one slice per action, named as the action.
#include <catch2/catch.hpp>

#include <map>

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
