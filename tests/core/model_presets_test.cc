// Model presets: each validates and our parameter count matches the published size within 2%.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>

#include "core/error.h"
#include "core/formulas.h"
#include "core/model_presets.h"

using Catch::Matchers::Contains;

TEST_CASE("every preset validates and matches its published size within 2%", "[model_presets]") {
  const std::set<std::string> required = {
      "gpt2-124m",     "gpt2-350m",     "gpt2-774m",       "gpt2-1.5b",  "gpt-1.3b",      "gpt3-175b",
      "gpt-1t",        "llama2-7b",     "llama3-8b",       "llama3-70b", "llama3.1-405b", "mixtral-8x7b",
      "mixtral-8x22b", "qwen3-30b-a3b", "qwen3-235b-a22b", "qwen3-8b",   "qwen3-32b"};
  std::set<std::string> seen;
  for (const megaplan::ModelPreset& preset : megaplan::model_presets()) {
    INFO(preset.spec.name);
    seen.insert(preset.spec.name);
    CHECK_NOTHROW(megaplan::validate_model_spec(preset.spec));
    CHECK_FALSE(preset.citation.empty());
    const double counted = static_cast<double>(megaplan::total_parameters(preset.spec));
    CHECK(std::abs(counted / preset.published_parameters - 1.0) < 0.02);
  }
  for (const std::string& name : required) {
    INFO(name);
    CHECK(seen.count(name) == 1);
  }
}

TEST_CASE("exact counts for models whose sizes are published to the parameter", "[model_presets]") {
  // Hugging Face's Meta-Llama-3-8B has 8,030,261,248 parameters; the vocabulary 128256 needs no padding.
  CHECK(megaplan::total_parameters(megaplan::model_preset("llama3-8b")) == 8'030'261'248);
  // GPT-2 small has 124,439,808 with its 50257-token vocabulary; Megatron pads it to 50304,
  // adding 47 * 768 = 36,096 embedding parameters.
  CHECK(megaplan::total_parameters(megaplan::model_preset("gpt2-124m")) == 124'439'808 + 47 * 768);
  // Mixtral-8x7B-v0.1: 46,702,792,704, and 8x22B 140,630,071,296 (transformers 5.17's
  // MixtralForCausalLM of each config, counted on the device, 2026-11-29); 12.9B of 8x7B's a
  // token's: every layer's 6 experts outside the top 2 (3 x 4096 x 14336 each) left out.
  const megaplan::ModelSpec mixtral = megaplan::model_preset("mixtral-8x7b");
  CHECK(megaplan::total_parameters(mixtral) == 46'702'792'704);
  CHECK(megaplan::active_parameters(mixtral) == 46'702'792'704 - 32 * 6 * int64_t{3 * 4096 * 14336});
  CHECK(static_cast<double>(megaplan::active_parameters(mixtral)) / 1e9 == Approx(12.9).margin(0.05));
  const megaplan::ModelSpec large = megaplan::model_preset("mixtral-8x22b");
  CHECK(megaplan::total_parameters(large) == 140'630'071'296);
  CHECK(static_cast<double>(megaplan::active_parameters(large)) / 1e9 == Approx(39.2).margin(0.1));  // "39B active"
  CHECK(megaplan::active_parameters(megaplan::model_preset("llama3-8b")) == 8'030'261'248);          // dense: all
  // Qwen3-MoE, counted by hand from the configs (embeddings and lm_head untied; per layer the
  // attention with heads of 128, the query and key norms (128 each), two norms, the router and 128
  // experts): 30.53B with 3.35B active ("30.5B, 3.3B activated"), 235.09B with 22.19B ("235B, 22B").
  const megaplan::ModelSpec qwen3 = megaplan::model_preset("qwen3-30b-a3b");
  CHECK(megaplan::total_parameters(qwen3) == 30'532'122'624);
  CHECK(megaplan::active_parameters(qwen3) == 3'353'032'704);
  const megaplan::ModelSpec qwen3_large = megaplan::model_preset("qwen3-235b-a22b");
  CHECK(megaplan::total_parameters(qwen3_large) == 235'093'634'560);
  CHECK(megaplan::active_parameters(qwen3_large) == 22'190'763'520);
  // Qwen3's dense 8B and 32B by hand likewise: 8,190,735,360 and 32,762,123,264 ("8.2B", "32.8B").
  CHECK(megaplan::total_parameters(megaplan::model_preset("qwen3-8b")) == 8'190'735'360);
  CHECK(megaplan::total_parameters(megaplan::model_preset("qwen3-32b")) == 32'762'123'264);
}

TEST_CASE("an unknown preset lists the known ones", "[model_presets]") {
  CHECK_THROWS_WITH(
      megaplan::model_preset("gpt5"),
      Contains("--model: unknown preset \"gpt5\"; known presets: gpt2-124m, gpt2-350m") && Contains("llama3.1-405b"));
}
