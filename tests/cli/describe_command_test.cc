// `megaplan describe`: flags resolve to a validated job; --out writes it atomically; --plan reads it.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/describe_command.h"
#include "core/error.h"

using Catch::Matchers::Contains;
using megaplan::cli::DescribeOptions;

namespace {

DescribeOptions gpt3_on_1024_a100() {
  DescribeOptions options;
  options.model.model = "gpt3-175b";
  options.cluster.cluster = "dgx-a100-80gb";
  options.cluster.gpus = 1024;
  options.plan.tensor_parallel_size = 8;
  options.plan.pipeline_parallel_size = 16;
  options.plan.global_batch_size = 1536;
  return options;
}

std::filesystem::path fresh_directory(const std::string& name) {
  const std::filesystem::path directory = std::filesystem::temp_directory_path() / ("megaplan-test-" + name);
  std::filesystem::remove_all(directory);
  std::filesystem::create_directories(directory);
  return directory;
}

}  // namespace

TEST_CASE("describe prints the resolved job", "[describe_command]") {
  std::ostringstream out;
  CHECK(megaplan::cli::run_describe(gpt3_on_1024_a100(), out) == 0);
  const std::string text = out.str();
  CHECK_THAT(text, Contains("gpt3-175b on 1024 x A100-SXM4-80GB"));
  CHECK_THAT(text, Contains("vocab 50257 padded to 51200 for tp 8"));
  CHECK_THAT(text, Contains("tp 8 x pp 16 x cp 1 x dp 8 = 1024 GPUs"));
  CHECK_THAT(text, Contains("192 microbatches per replica"));
  CHECK_THAT(text, Contains("174.6B parameters"));
}

TEST_CASE("describe --json carries the job and its derived numbers", "[describe_command]") {
  DescribeOptions options = gpt3_on_1024_a100();
  options.json = true;
  options.plan.layers_per_virtual_stage = 2;  // vpp 3, interleaved by default
  std::ostringstream out;
  megaplan::cli::run_describe(options, out);
  const nlohmann::json json = nlohmann::json::parse(out.str());
  CHECK(json["job"]["plan"]["virtual_pipeline_parallel_size"] == 3);
  CHECK(json["job"]["plan"]["schedule"] == "interleaved");
  CHECK(json["job"]["plan"]["data_parallel_size"] == 8);
  CHECK(json["num_microbatches"] == 192);
  CHECK(json["padded_vocab_size"] == 51200);
  CHECK(json["pipeline_ranks"].size() == 16);
  CHECK(json["pipeline_ranks"][1]["virtual_stages"] == nlohmann::json::array({1, 17, 33}));
  CHECK(json["model_flops_per_iteration"].get<double>() == Approx(3.3861967463873244e18));
}

TEST_CASE("describe --out writes a job that --plan reads back", "[describe_command]") {
  const std::filesystem::path directory = fresh_directory("describe-out");
  const std::string path = (directory / "plan.json").string();
  DescribeOptions options = gpt3_on_1024_a100();
  options.out = path;
  options.plan.sequence_parallel = true;
  std::ostringstream first;
  megaplan::cli::run_describe(options, first);

  DescribeOptions from_file;
  from_file.plan_file = path;
  std::ostringstream second;
  megaplan::cli::run_describe(from_file, second);
  CHECK(second.str() == first.str());
  std::filesystem::remove_all(directory);
}

TEST_CASE("an invalid job writes nothing", "[describe_command]") {
  const std::filesystem::path directory = fresh_directory("describe-bad");
  DescribeOptions options = gpt3_on_1024_a100();
  options.out = (directory / "plan.json").string();
  options.plan.tensor_parallel_size = 5;  // 96 heads are not divisible by 5, nor is 1024 by 5*16
  std::ostringstream out;
  CHECK_THROWS_AS(megaplan::cli::run_describe(options, out), megaplan::SpecError);
  CHECK(std::filesystem::is_empty(directory));
  CHECK(out.str().empty());
  std::filesystem::remove_all(directory);
}

TEST_CASE("explicit model flags override the preset", "[describe_command]") {
  DescribeOptions options;
  options.model.model = "gpt2-124m";
  options.model.num_layers = 6;
  options.model.seq_length = 512;
  options.model.swiglu = true;
  options.cluster.cluster = "h100-x1";
  options.json = true;
  std::ostringstream out;
  megaplan::cli::run_describe(options, out);
  const nlohmann::json model = nlohmann::json::parse(out.str())["job"]["model"];
  CHECK(model["num_layers"] == 6);
  CHECK(model["seq_length"] == 512);
  CHECK(model["hidden_size"] == 768);
  CHECK(model["swiglu"] == true);
  CHECK(model["ffn_hidden_size"] == 2048);  // SwiGLU's default: int(4 * 768 * 2 / 3 / 64) * 64
}

TEST_CASE("multi-node clusters need --gpus", "[describe_command]") {
  DescribeOptions options;
  std::ostringstream out;
  CHECK_THROWS_WITH(megaplan::cli::run_describe(options, out),
                    "--gpus: required for the multi-node cluster dgx-a100-80gb (4096 nodes x 8 GPUs)");
}
