// GPT-2's merges.txt (--merge-file): the input with the vocab.json of tests/data/gpt2_tiny, then an
// encode and decode of a sample, which must give the sample back (gpt2_tokenizer.h's contract).
#include <string>

#include "executor/data/gpt2_tokenizer.h"
#include "tests/fuzz/fuzz_support.h"
#include "tests/fuzz/tokenizer_sample.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string merges = megaplan::fuzz::scratch_directory() + "/merges.txt";
  megaplan::fuzz::write_file(merges, megaplan::fuzz::as_text(data, size));
  return megaplan::fuzz::refusing_only_with_spec_error([&] {
    const megaplan::exec::Gpt2Tokenizer tokenizer(MEGAPLAN_SOURCE_DIR "/tests/data/gpt2_tiny/vocab.json", merges);
    const std::string_view sample = megaplan::fuzz::kTokenizerSample;
    megaplan::fuzz::require(tokenizer.decode(tokenizer.encode(sample)) == sample, "decode(encode(text)) != text");
  });
}
