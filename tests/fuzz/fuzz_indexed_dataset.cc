// Megatron's indexed dataset (--data-path PREFIX): the input is PREFIX.idx followed by
// PREFIX.bin, split where the index's own header says it ends (34 bytes, then 12 per sequence and
// 8 per document index), so that mutations reach both files and the seeds (an .idx and its .bin
// back to back) split exactly. The dataset is opened, and every token and index read.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "executor/data/indexed_dataset.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

constexpr std::size_t kHeaderBytes = 34;

// The .idx length the header at `data` promises, at most `size` (a header with absurd counts
// takes the whole input, and the reader refuses the mismatch).
std::size_t index_length(const uint8_t* data, std::size_t size) {
  if (size < kHeaderBytes) return size;
  uint64_t sequences = 0, documents = 0;
  std::memcpy(&sequences, data + 18, sizeof sequences);
  std::memcpy(&documents, data + 26, sizeof documents);
  const uint64_t room = size - kHeaderBytes;
  if (sequences > room / 12) return size;
  const uint64_t rest = room - sequences * 12;
  if (documents > rest / 8) return size;
  return kHeaderBytes + static_cast<std::size_t>(sequences * 12 + documents * 8);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string prefix = megaplan::fuzz::scratch_directory() + "/dataset";
  const std::string_view input = megaplan::fuzz::as_text(data, size);
  const std::size_t split = index_length(data, size);
  megaplan::fuzz::write_file(prefix + ".idx", input.substr(0, split));
  megaplan::fuzz::write_file(prefix + ".bin", input.substr(split));
  return megaplan::fuzz::refusing_only_with_spec_error([&] {
    const megaplan::exec::IndexedDataset dataset(prefix);
    for (std::size_t d = 0; d <= dataset.num_documents(); ++d) (void)dataset.document_start(d);
    for (std::size_t s = 0; s < dataset.num_sequences(); ++s) {
      const std::vector<int64_t> tokens = dataset.sequence(s);
      megaplan::fuzz::require(tokens.size() == static_cast<std::size_t>(dataset.sequence_length(s)),
                              "a sequence's tokens differ from its length");
      if (!tokens.empty()) {
        int64_t last = 0;
        dataset.read(s, tokens.size() - 1, 1, &last);
        megaplan::fuzz::require(last == tokens.back(), "read() and sequence() disagree");
      }
    }
    (void)dataset.token_range();
  });
}
