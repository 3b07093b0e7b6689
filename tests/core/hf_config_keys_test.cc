// The Hugging Face importer knows every key of transformers' configs (issue 42): each key of
// transformers' default config of a type it reads is read, or ignored for a reason
// (core/hf_config.cc's tables), and a key it does not know is refused rather than ignored. The
// defaults are transformers 5.17's (tests/data/hf_default_configs.json, written by
// tools/dump_hf_default_configs.py on a machine that has transformers).
#include <catch2/catch.hpp>

#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/hf_config.h"
#include "core/json_io.h"

namespace {

const nlohmann::json& default_configs() {
  static const nlohmann::json configs =
      megaplan::read_json_file(std::string(MEGAPLAN_TEST_DATA_DIR) + "/hf_default_configs.json");
  return configs;
}

// The error line importing `config` gives ("" when it imports).
std::string import_error(const nlohmann::json& config) {
  try {
    (void)megaplan::model_spec_from_hf_config(config, "config.json");
  } catch (const megaplan::SpecError& error) {
    return error.what();
  }
  return "";
}

}  // namespace

TEST_CASE("every key of transformers' default configs of the types read is read or ignored for a reason",
          "[hf_config]") {
  const nlohmann::json& read = default_configs().at("read");
  REQUIRE(read.size() == 8);
  for (const auto& [type, defaults] : read.items()) {
    INFO(type);
    nlohmann::json config = defaults;
    // MistralConfig's default window of 4096 (v0.1's) is sliding-window attention, refused
    // (hf_config_test.cc); v0.2 on have none, as here.
    if (type == "mistral") {
      CHECK(import_error(config).find("config.json: sliding_window: sliding-window attention is not modelled") == 0);
      config["sliding_window"] = nullptr;
    }
    CHECK(import_error(config) == "");
    // A key the importer does not know may change the model: refused, never ignored.
    nlohmann::json extended = config;
    extended["attn_logit_softcapping"] = 50.0;
    CHECK(import_error(extended).find("config.json: attn_logit_softcapping: megaplan does not read this key for "
                                      "model_type \"" +
                                      type + "\"") == 0);
  }
}

TEST_CASE("the types refused are refused by model_type, by architectures, and without both by their keys",
          "[hf_config]") {
  // OLMo 2's keys are all the Llama family's (its norms' places differ, not its config's keys): only
  // model_type or architectures tell it from Llama, as they do.
  const std::set<std::string> llama_keys_only = {"olmo2"};
  const nlohmann::json& refused = default_configs().at("refused");
  REQUIRE(refused.size() == 8);
  for (const auto& [type, config] : refused.items()) {
    INFO(type);
    CHECK(import_error(config).find("config.json: model_type: unsupported \"" + type + "\"") == 0);
    nlohmann::json untyped = config;
    untyped.erase("model_type");
    CHECK(import_error(untyped).find("config.json: architectures: \"" +
                                     config.at("architectures")[0].get<std::string>() +
                                     "\" is not a model megaplan reads") == 0);
    untyped.erase("architectures");
    const std::string unnamed = import_error(untyped);
    INFO(unnamed);
    if (llama_keys_only.count(type)) {
      CHECK(unnamed == "");
    } else {
      CHECK(unnamed.rfind("config.json: ", 0) == 0);
    }
  }
}
