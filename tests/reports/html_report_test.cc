// The HTML report's data: the simulated timeline as rows of compact slices with SEND -> RECV
// arrows, the layers each virtual stage holds, memory parts per pipeline rank, a search's ranked
// plans as the alternatives (a malformed search file refused naming the field), and the page with
// d3 and the data inlined, a "</script>" in the data unable to end its script element.
#include <catch2/catch.hpp>

#include <functional>

#include <set>
#include <string>

#include "core/cluster_spec.h"
#include "core/error.h"
#include "core/model_presets.h"
#include "reports/html_report.h"
#include "reports/search_provenance.h"
#include "simulated_pipeline.h"

using Catch::Matchers::Contains;

namespace {

megaplan::PlanReport small_report() {
  megaplan::PlanReport report;
  report.job.model = megaplan::model_preset("gpt2-124m");
  report.job.cluster = megaplan::cluster_preset("dgx-h100");
  report.job.plan.pipeline_parallel_size = 2;
  report.job.plan.micro_batch_size = 1;
  report.job.plan.global_batch_size = 4;
  report.timeline = megaplan::test::simulated_1f1b(4).result.timeline;
  report.iteration_time_s = 0.02;
  for (int64_t rank = 0; rank < 2; ++rank) {
    megaplan::PipelineRankMemory memory;
    memory.pipeline_rank = rank;
    memory.weight_bytes = 100 + rank;
    memory.activation_bytes = 50;
    memory.peak_inflight_microbatches = 2 - rank;
    memory.total_bytes = 150 + rank;
    report.memory.push_back(memory);
  }
  return report;
}

}  // namespace

TEST_CASE("the report's timeline: rows, sorted compact slices, layers and SEND -> RECV arrows", "[reports]") {
  const megaplan::PlanReport report = small_report();
  const nlohmann::json data = megaplan::report_data(report);
  const nlohmann::json& timeline = data.at("timeline");
  std::set<std::pair<int, std::string>> streams;
  for (const megaplan::TimelineSlice& slice : report.timeline.slices) {
    streams.emplace(slice.pipeline_rank, megaplan::to_string(slice.stream));
  }
  REQUIRE(timeline.at("rows").size() == streams.size());
  CHECK(timeline.at("rows")[0] == nlohmann::json{{"rank", 0}, {"stream", "compute"}});
  const nlohmann::json& slices = timeline.at("slices");
  REQUIRE(slices.size() == report.timeline.slices.size());
  for (std::size_t i = 1; i < slices.size(); ++i) {
    const bool ordered =
        slices[i - 1][0] < slices[i][0] || (slices[i - 1][0] == slices[i][0] && slices[i - 1][1] <= slices[i][1]);
    CHECK(ordered);
  }
  const nlohmann::json& kinds = timeline.at("kinds");
  // 1F1B over 2 stages and 4 microbatches: 4 forward sends from stage 0, 4 backward sends from stage 1.
  const nlohmann::json& arrows = timeline.at("arrows");
  REQUIRE(arrows.size() == 8);
  for (const nlohmann::json& arrow : arrows) {
    const nlohmann::json& send = slices[arrow[0].get<std::size_t>()];
    const nlohmann::json& receive = slices[arrow[1].get<std::size_t>()];
    const std::string send_kind = kinds[send[3].get<std::size_t>()],
                      receive_kind = kinds[receive[3].get<std::size_t>()];
    CHECK(((send_kind == "SEND_F" && receive_kind == "RECV_F") || (send_kind == "SEND_B" && receive_kind == "RECV_B")));
    CHECK(receive[4] == send[4].get<int>() + (send_kind == "SEND_F" ? 1 : -1));  // the next or previous stage
    CHECK(receive[5] == send[5]);                                                // the same microbatch
    CHECK(receive[1].get<double>() >= send[1].get<double>());
  }
  CHECK(timeline.at("layers") == nlohmann::json::parse("[[0, 5], [6, 11]]"));
  CHECK(timeline.at("span_s").get<double>() >= 0.02);
  const nlohmann::json& memory = data.at("memory").at("ranks");
  REQUIRE(memory.size() == 2);
  CHECK(memory[1].at("parts")[0] == nlohmann::json{{"name", "weights"}, {"bytes", 101}});
  CHECK(memory[0].at("inflight_microbatches") == 2);
  CHECK(data.at("alternatives").is_null());
  CHECK(data.at("summary").at("plan").at("microbatches") == 4);
}

namespace {

// What `search --json` records of a search of `job`'s model and cluster.
nlohmann::json provenance_of(const megaplan::JobSpec& job) {
  return megaplan::search_provenance(job.model, job.cluster, job.plan.implementation, job.plan.options);
}

}  // namespace

TEST_CASE("a search's ranked plans become the alternatives; a malformed search is refused naming the field",
          "[reports]") {
  megaplan::PlanReport report = small_report();
  report.job.cluster.num_nodes = 1;  // the plans' world: 2 GPUs
  report.job.cluster.gpus_per_node = 2;
  const auto plan = [](int64_t pp, double seconds, bool fits) {
    return nlohmann::json{{"tensor_parallel_size", 1},
                          {"pipeline_parallel_size", pp},
                          {"context_parallel_size", 1},
                          {"data_parallel_size", 2 / pp},
                          {"virtual_pipeline_parallel_size", 1},
                          {"micro_batch_size", 1},
                          {"global_batch_size", 4},
                          {"schedule", "1f1b"},
                          {"recompute_granularity", "none"},
                          {"iteration_time_s", seconds},
                          {"peak_memory_bytes", 1000},
                          {"fits_in_memory", fits},
                          {"tie_with_best", false},
                          {"compute_s", seconds / 2},
                          {"tensor_comm_s", 0.0},
                          {"pipeline_comm_s", 0.001},
                          {"data_parallel_comm_s", 0.0},
                          {"idle_s", 0.002}};
  };
  report.search = nlohmann::json{{"tie_tolerance", 0.05}, {"plans", {plan(2, 0.02, true), plan(1, 0.03, false)}}};
  report.search->update(provenance_of(report.job));
  report.search_source = "search.json";
  const nlohmann::json alternatives = megaplan::report_data(report).at("alternatives");
  CHECK(alternatives.at("uncertainty") == 0.05);
  REQUIRE(alternatives.at("plans").size() == 2);
  CHECK(alternatives.at("plans")[0].at("chosen") == true);  // the report's own plan: pp 2
  CHECK(alternatives.at("plans")[0].at("label") == "tp 1 pp 2 cp 1 dp 1 mbs 1 1f1b");
  CHECK(alternatives.at("plans")[1].at("chosen") == false);
  CHECK(alternatives.at("plans")[1].at("fits") == false);  // shown, marked
  CHECK(alternatives.at("plans")[1].at("terms").at("idle") == 0.002);
  // Faster layouts refused on memory follow the ranking, marked.
  report.search->emplace("over_memory", nlohmann::json::array({plan(2, 0.015, true)}));
  const nlohmann::json with_over = megaplan::report_data(report).at("alternatives").at("plans");
  REQUIRE(with_over.size() == 3);
  CHECK(with_over[2].at("rank") == "over");
  CHECK(with_over[2].at("fits") == false);
  report.search->at("over_memory")[0].erase("compute_s");
  CHECK_THROWS_WITH(megaplan::report_data(report), Contains("search.json: over_memory[0]: compute_s"));
  report.search->erase("over_memory");
  report.search->at("plans")[1].erase("idle_s");
  CHECK_THROWS_WITH(megaplan::report_data(report),
                    Contains("search.json: plans[1]: idle_s: required field is missing"));
  report.search = nlohmann::json{{"plans", 3}};
  CHECK_THROWS_WITH(megaplan::report_data(report), Contains("--search: search.json: plans: must be the array"));

  // Plans the planner could not have ranked there: each refused naming the rule (issue 42).
  const auto refusal = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json entry = plan(2, 0.02, true);
    edit(entry);
    report.search = nlohmann::json{{"plans", {entry}}};
    report.search->update(provenance_of(report.job));
    try {
      (void)megaplan::report_data(report);
    } catch (const megaplan::SpecError& error) {
      CHECK(error.field() == "--search");
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  CHECK(refusal([](nlohmann::json&) {}) == "accepted");
  CHECK(refusal([](nlohmann::json& p) { p["tensor_parallel_size"] = 1024; }) ==
        "--search: search.json: plans[0]: tp x pp x cp x dp is 2048 GPUs, but the search was of 2");
  CHECK_THAT(refusal([](nlohmann::json& p) { p["data_parallel_size"] = 0; }),
             Contains("--search: search.json: plans[0]: ") && Contains("data_parallel_size"));
  CHECK(refusal([](nlohmann::json& p) { p["iteration_time_s"] = -0.5; }) ==
        "--search: search.json: plans[0]: iteration_time_s: must be a finite number > 0, got -0.5");
  CHECK(refusal([](nlohmann::json& p) { p["mfu"] = 7.5; }) ==
        "--search: search.json: plans[0]: mfu: must be a finite number >= 0 and at most 1, got 7.5");
  CHECK_THAT(refusal([](nlohmann::json& p) { p["micro_batch_size"] = 3; }),
             Contains("--search: search.json: plans[0]: "));
}

TEST_CASE("alternatives that differ only in ep or etp read apart", "[reports]") {
  megaplan::PlanReport report = small_report();
  report.job.cluster.num_nodes = 1;  // the plans' world: 2 GPUs
  report.job.cluster.gpus_per_node = 2;
  report.job.model.moe.num_experts = 4;
  report.job.model.moe.ffn_hidden_size = 768;
  const auto plan = [](int64_t ep, int64_t etp) {
    nlohmann::json entry{{"tensor_parallel_size", 1},
                         {"pipeline_parallel_size", 1},
                         {"context_parallel_size", 1},
                         {"data_parallel_size", 2},
                         {"virtual_pipeline_parallel_size", 1},
                         {"micro_batch_size", 1},
                         {"global_batch_size", 4},
                         {"schedule", "1f1b"},
                         {"recompute_granularity", "none"},
                         {"iteration_time_s", 0.02},
                         {"peak_memory_bytes", 1000},
                         {"fits_in_memory", true},
                         {"compute_s", 0.01},
                         {"tensor_comm_s", 0.0},
                         {"pipeline_comm_s", 0.0},
                         {"data_parallel_comm_s", 0.0},
                         {"idle_s", 0.0}};
    if (ep > 1) entry["expert_model_parallel_size"] = ep;
    if (etp > 0) entry["expert_tensor_parallel_size"] = etp;
    return entry;
  };
  report.search = nlohmann::json{{"plans", {plan(2, 0), plan(1, 0), plan(1, 2)}}};
  report.search->update(provenance_of(report.job));
  report.search_source = "search.json";
  const nlohmann::json plans = megaplan::report_data(report).at("alternatives").at("plans");
  REQUIRE(plans.size() == 3);
  CHECK(plans[0].at("label") == "tp 1 pp 1 cp 1 dp 2 ep 2 mbs 1 1f1b");
  CHECK(plans[1].at("label") == "tp 1 pp 1 cp 1 dp 2 mbs 1 1f1b");
  CHECK(plans[2].at("label") == "tp 1 pp 1 cp 1 dp 2 etp 2 mbs 1 1f1b");
}

TEST_CASE("a search of another model or cluster, or one without them recorded, is refused in one line", "[reports]") {
  megaplan::PlanReport report = small_report();
  report.search_source = "search.json";
  const auto refusal = [&](const nlohmann::json& provenance) {
    report.search = nlohmann::json{{"plans", nlohmann::json::array()}};
    report.search->update(provenance);
    try {
      (void)megaplan::report_data(report);
    } catch (const megaplan::SpecError& error) {
      CHECK(error.field() == "--search");
      return error.rule();
    }
    return std::string("accepted");
  };
  const nlohmann::json same = provenance_of(report.job);
  CHECK(refusal(same) == "accepted");
  CHECK(same.at("model").at("spec").at("num_layers") == report.job.model.num_layers);
  CHECK(same.at("cluster").at("gpus") == report.job.cluster.total_gpus());
  CHECK(same.at("implementation").at("name") == "megaplan");
  // The model's name is not its identity: a renamed copy is the same model ...
  megaplan::JobSpec searched = report.job;
  searched.model.name = "renamed";
  CHECK(refusal(provenance_of(searched)) == "accepted");
  // ... and one of the same name with other layers is another.
  searched = report.job;
  searched.model.num_layers += 2;
  const std::string layers = std::to_string(report.job.model.num_layers);
  CHECK(refusal(provenance_of(searched)) ==
        "search.json is a search of another model than this plan's " + report.job.model.name + ": num_layers is " +
            std::to_string(searched.model.num_layers) + " there, " + layers + " here");
  // Another GPU count, another GPU.
  searched = report.job;
  searched.cluster.num_nodes *= 2;
  CHECK(refusal(provenance_of(searched))
            .find("search.json is a search of " + std::to_string(2 * report.job.cluster.total_gpus()) + " GPUs of ") ==
        0);
  searched = report.job;
  searched.cluster.name = "other";
  searched.cluster.gpu.hbm_capacity_bytes /= 2;
  CHECK(refusal(provenance_of(searched)) == "search.json is a search of another cluster (other) than this plan's " +
                                                report.job.cluster.name + ": gpu.hbm_capacity_bytes is " +
                                                std::to_string(searched.cluster.gpu.hbm_capacity_bytes) + " there, " +
                                                std::to_string(report.job.cluster.gpu.hbm_capacity_bytes) + " here");
  // A search written before megaplan recorded them: re-run it.
  CHECK(refusal(nlohmann::json::object()) ==
        "search.json records no model and cluster (a search written before megaplan recorded them), so it cannot be "
        "matched to this plan: re-run `megaplan search --json`");
  nlohmann::json damaged = same;
  damaged["model"]["spec"] = 3;
  CHECK(refusal(damaged) == "search.json: model.spec: must be an object, as `megaplan search --json` writes it");
}

TEST_CASE("the page inlines d3 and the data; the data cannot close its script element", "[reports]") {
  megaplan::PlanReport report = small_report();
  report.job.model.name = "a</script>b";
  const std::string page = megaplan::render_html_report(megaplan::report_data(report));
  CHECK_THAT(page, Contains("d3js.org v5.16.0"));
  CHECK_THAT(page, Contains("window.MEGAPLAN = {"));
  CHECK_THAT(page, Contains("a<\\/script>b"));
  CHECK(page.find("a</script>b") == std::string::npos);
  CHECK(page.find("/*MEGAPLAN_DATA*/") == std::string::npos);
  CHECK(page.find("/*MEGAPLAN_D3*/") == std::string::npos);
}

TEST_CASE(
    "a measured timeline of the plan: residuals per rank and kind, the iteration's error; another plan's "
    "is refused",
    "[reports]") {
  megaplan::PlanReport report = small_report();
  megaplan::Timeline measured = report.timeline;
  for (megaplan::TimelineSlice& slice : measured.slices) {  // everything 25% slower
    slice.start_s *= 1.25;
    slice.end_s *= 1.25;
  }
  report.measured = measured;
  report.measured_source = "m.json";
  const nlohmann::json data = megaplan::report_data(report).at("measured");
  CHECK(data.at("source") == "measured: m.json");
  CHECK(data.at("error").get<double>() == Approx(1 / 1.25 - 1));
  CHECK(data.at("same_order") == true);
  REQUIRE_FALSE(data.at("residuals").empty());
  for (const nlohmann::json& row : data.at("residuals")) {  // kinds that take time (not REDUCE_GRAD here)
    if (row.at("measured_s").get<double>() > 0) CHECK(row.at("error").get<double>() == Approx(1 / 1.25 - 1));
  }
  CHECK(data.at("timeline").at("slices").size() == measured.slices.size());
  report.measured = megaplan::test::simulated_1f1b(3).result.timeline;  // 3 microbatches, not 4
  CHECK_THROWS_WITH(megaplan::report_data(report), Contains("--measured: "));
}
