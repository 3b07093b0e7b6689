// A simulated timeline becomes a trace Perfetto loads: one slice per action, named as the action.
#include <catch2/catch.hpp>

#include <map>

#include "core/action_work.h"
#include "core/memory_model.h"
#include "core/model_presets.h"
#include "reports/chrome_trace.h"
#include "simulated_pipeline.h"
#include "simulator/simulate_plan.h"

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
      const double flops = megaplan::stage_work(job.model, job.plan)[1].forward_flops;
      CHECK(flops > 0);
      CHECK(event.at("args") ==
            nlohmann::json{{"virtual_stage", 1}, {"microbatch", 2}, {"layers", "6-11"}, {"flops", flops}});
    }
    if (phase == "X" && event.at("name") == "0SEND_F1") {
      CHECK(event.at("args").at("bytes") == 2 * 1024 * 768);  // bf16 hidden states of one sequence
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
  CHECK(trace.at("otherData").at("plan") ==
        "tp 1, pp 2, cp 1, dp 1, vpp 1, mbs 1, gbs 4, recompute none, sp off, distributed optimizer off, 1f1b");
  // Flows and args change nothing the reader takes back.
  CHECK(megaplan::timeline_from_chrome_trace(trace, "t.json").slices.size() == pipeline.result.timeline.slices.size());
}

namespace {

// gpt2-350m with tp 2 (sequence parallel) and cp 2 over pp 2, interleaved, simulated on the datasheet.
megaplan::JobSpec detailed_job() {
  megaplan::JobSpec job;
  job.model = megaplan::model_preset("gpt2-350m");
  job.cluster = megaplan::cluster_preset("dgx-h100");
  job.cluster.num_nodes = 1;
  job.plan.tensor_parallel_size = 2;
  job.plan.context_parallel_size = 2;
  job.plan.pipeline_parallel_size = 2;
  job.plan.data_parallel_size = 1;
  job.plan.virtual_pipeline_parallel_size = 2;
  job.plan.schedule = megaplan::ScheduleKind::kInterleaved;
  job.plan.sequence_parallel = true;
  job.plan.micro_batch_size = 1;
  job.plan.global_batch_size = 8;
  job.plan.implementation = megaplan::Implementation::kMegatronCore;
  job.plan.options = megaplan::default_implementation_options(job.plan.implementation);
  return job;
}

}  // namespace

TEST_CASE("the memory counter of each rank peaks at the memory model's activations", "[reports][trace]") {
  const megaplan::JobSpec job = detailed_job();
  const megaplan::sim::PlanSimulation simulation =
      megaplan::sim::simulate_plan(job, megaplan::sim::Profile::datasheet(job.cluster.gpu), true);
  const nlohmann::json trace = megaplan::timeline_to_chrome_trace(simulation.result.timeline, job);
  std::map<int64_t, double> peak;
  std::map<int64_t, double> last;
  for (const nlohmann::json& event : trace.at("traceEvents")) {
    if (event.at("ph") != "C") continue;
    CHECK(event.at("name") == "memory");
    const int64_t rank = event.at("pid");
    const double activations = event.at("args").at("activations GiB");
    peak[rank] = std::max(peak[rank], activations);
    last[rank] = activations;
    const megaplan::PipelineRankMemory& held = simulation.memory.at(static_cast<std::size_t>(rank));
    CHECK(event.at("args").at("model state GiB").get<double>() ==
          Approx(static_cast<double>(held.weight_bytes + held.gradient_bytes + held.optimizer_bytes +
                                     held.runtime_reserve_bytes) /
                 (1 << 30))
              .margin(1e-4));
  }
  REQUIRE(peak.size() == 2);
  for (const auto& [rank, gib] : peak) {
    INFO("pipeline rank " << rank);
    CHECK(gib ==
          Approx(static_cast<double>(simulation.memory[static_cast<std::size_t>(rank)].activation_bytes) / (1 << 30))
              .margin(1e-4));
    CHECK(last[rank] == 0);  // every backward freed what its forward held
  }
}

TEST_CASE("--trace-detail draws each compute slice's collectives, and the reader skips them", "[reports][trace]") {
  const megaplan::JobSpec job = detailed_job();
  const megaplan::sim::PlanSimulation simulation =
      megaplan::sim::simulate_plan(job, megaplan::sim::Profile::datasheet(job.cluster.gpu), true);
  const nlohmann::json trace = megaplan::timeline_to_chrome_trace(simulation.result.timeline, job, true);
  std::map<std::pair<int64_t, std::string>, double> drawn;  // (rank, action) -> seconds
  std::size_t count = 0;
  for (const nlohmann::json& event : trace.at("traceEvents")) {
    if (event.at("ph") != "X" || event.at("cat") != "tp/cp collectives") continue;
    CHECK(event.at("name") == "sp all-gather/reduce-scatter + cp K/V ring");
    drawn[{event.at("pid").get<int64_t>(), event.at("args").at("action").get<std::string>()}] +=
        event.at("dur").get<double>() * 1e-6;
    ++count;
  }
  std::size_t with_collectives = 0;
  for (const megaplan::TimelineSlice& slice : simulation.result.timeline.slices) {
    if (slice.collective_s <= 0) continue;
    ++with_collectives;
    CHECK(slice.stream == megaplan::TimelineStream::kCompute);
    CHECK(drawn[{slice.pipeline_rank, megaplan::to_string(slice.action)}] == Approx(slice.collective_s).epsilon(1e-9));
  }
  CHECK(with_collectives > 0);
  CHECK(count == 2 * 6 * with_collectives);  // 24 layers over 4 virtual stages: 6 per slice, two each
  const megaplan::Timeline back = megaplan::timeline_from_chrome_trace(trace, "t.json");
  CHECK(back.slices.size() == simulation.result.timeline.slices.size());
}
