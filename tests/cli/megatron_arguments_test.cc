// planner::megatron_arguments read back by megaplan's own Megatron-style flags: the emitted model
// flags describe the model completely (nothing left to a default), whatever model they start from.
#include <CLI/CLI.hpp>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "cli/shared_options.h"
#include "core/model_presets.h"
#include "planner/megatron_arguments.h"

namespace {

// The model `arguments` (notes skipped) describe, parsed over `base`'s preset.
megaplan::ModelSpec parsed(const std::vector<std::string>& arguments, const std::string& base) {
  CLI::App app;
  megaplan::ModelOptions options;
  megaplan::cli::add_model_options(app, options);
  std::vector<std::string> words;
  for (const std::string& argument : arguments) {
    if (argument.rfind('#', 0) == 0) continue;
    std::istringstream split(argument);
    for (std::string word; split >> word;) words.push_back(word);
  }
  std::vector<std::string> reversed(words.rbegin(), words.rend());  // CLI11 parses a reversed vector
  app.parse(reversed);
  options.model = base;
  return megaplan::resolve_model(options);
}

}  // namespace

TEST_CASE("the emitted Megatron model flags read back as the model", "[cli][megatron]") {
  // A Qwen2-like model: every option away from its default, the booleans the flags can only set.
  megaplan::ModelSpec qwen = megaplan::model_preset("llama3-8b");
  qwen.add_qkv_bias = true;
  qwen.kv_channels = 96;
  qwen.rotary_percent = 0.5;
  qwen.norm_epsilon = 1e-6;
  qwen.make_vocab_size_divisible_by = 64;
  qwen.rope_scaling.factor = 8;
  // Each parsed over gpt2-124m, which has none of the flags the others set.
  for (const megaplan::ModelSpec& model :
       {megaplan::model_preset("llama3.1-405b"), megaplan::model_preset("gpt3-175b"), qwen}) {
    INFO(model.name);
    const megaplan::ModelSpec read = parsed(megaplan::planner::megatron_model_arguments(model), "gpt2-124m");
    nlohmann::json expected = megaplan::model_spec_to_json(model);
    nlohmann::json got = megaplan::model_spec_to_json(read);
    // The name is the base's; the vocabulary is the tokenizer's (a note, not a flag).
    for (const char* key : {"name", "vocab_size"}) {
      expected.erase(key);
      got.erase(key);
    }
    CHECK(got.dump(1) == expected.dump(1));
  }
}

TEST_CASE("the full argument list carries the model, bf16 and the vocabulary note", "[cli][megatron]") {
  megaplan::ParallelPlan plan;
  plan.tensor_parallel_size = 2;
  plan.global_batch_size = 8;
  const std::vector<std::string> arguments =
      megaplan::planner::megatron_arguments(megaplan::model_preset("llama3-8b"), plan);
  for (const char* flag :
       {"--num-layers 32", "--hidden-size 4096", "--ffn-hidden-size 14336", "--swiglu", "--normalization RMSNorm",
        "--group-query-attention", "--num-query-groups 8", "--position-embedding-type rope", "--rotary-base 500000",
        "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--bf16", "--tensor-model-parallel-size 2"}) {
    INFO(flag);
    CHECK(std::find(arguments.begin(), arguments.end(), flag) != arguments.end());
  }
  const std::string text = megaplan::planner::format_megatron_arguments(arguments);
  CHECK(text.find("\n# the vocabulary (128256 tokens)") != std::string::npos);
}
