// A Hugging Face tokenizer.json (--tokenizer-file; no tokenizer_config.json beside it): the
// reader's checks of model, normalizer, pre-tokenizer, vocabulary, merges and added tokens, then
// an encode of a sample and the end-of-document id.
#include <string>

#include "executor/data/hf_tokenizer.h"
#include "tests/fuzz/fuzz_support.h"
#include "tests/fuzz/tokenizer_sample.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = megaplan::fuzz::scratch_directory() + "/tokenizer.json";
  megaplan::fuzz::write_file(path, megaplan::fuzz::as_text(data, size));
  return megaplan::fuzz::refusing_only_with_spec_error([&] {
    const megaplan::exec::HfTokenizer tokenizer(path);
    for (const int64_t id : tokenizer.encode(megaplan::fuzz::kTokenizerSample)) {
      megaplan::fuzz::require(id >= 0 && id < tokenizer.vocab_size(), "an id outside the vocabulary");
    }
    (void)tokenizer.end_of_document();
  });
}
