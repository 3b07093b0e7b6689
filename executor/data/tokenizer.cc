#include "executor/data/tokenizer.h"

#include "core/error.h"

namespace megaplan::exec {

std::vector<int64_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> tokens(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind) {
  if (kind == "byte") return std::make_unique<ByteTokenizer>();
  throw SpecError("--tokenizer", "unknown tokenizer \"" + kind + "\" (known: byte)");
}

}  // namespace megaplan::exec
