// A megaplan model file (--model FILE.json with Megatron's argument names): the strict reader, the
// validation, and what a validated spec promises: Megatron's padded vocabulary without overflow,
// and the same JSON after a write and a read.
#include <nlohmann/json.hpp>

#include "core/json_io.h"
#include "core/model_spec.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return megaplan::fuzz::refusing_only_with_spec_error([&] {
    const nlohmann::json json = megaplan::parse_json_text(megaplan::fuzz::as_text(data, size), "model.json");
    const megaplan::ModelSpec spec = megaplan::model_spec_from_json(json, "model.json");
    megaplan::validate_model_spec(spec);
    (void)megaplan::padded_vocab_size(spec, 1);
    const nlohmann::json written = megaplan::model_spec_to_json(spec);
    megaplan::fuzz::require(megaplan::model_spec_to_json(megaplan::model_spec_from_json(written, "written")) == written,
                            "a validated model spec changed on a write and a read");
  });
}
