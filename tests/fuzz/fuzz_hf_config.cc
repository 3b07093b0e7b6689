// A Hugging Face config.json given to --model: the importer of llama, mistral, qwen2 and gpt2
// field names, then the validation every model passes.
#include <nlohmann/json.hpp>

#include "core/hf_config.h"
#include "core/json_io.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return megaplan::fuzz::refusing_only_with_spec_error([&] {
    const nlohmann::json json = megaplan::parse_json_text(megaplan::fuzz::as_text(data, size), "config.json");
    (void)megaplan::is_hf_config(json);
    megaplan::validate_model_spec(megaplan::model_spec_from_hf_config(json, "config.json"));
  });
}
