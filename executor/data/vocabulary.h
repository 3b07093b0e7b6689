// The vocabulary `megaplan train` builds its embedding and output layer for. Megatron takes it from
// the tokenizer; megaplan also trains on data prepared elsewhere, so where --vocab-size is absent it
// takes the tokenizer's size when a tokenizer is named, else the data's (its largest token id plus
// one), and says which; a size given by --vocab-size or a job file is kept. Whichever it is, every
// token of the data (every dataset of a blend) must fall inside it: an id past the embedding's rows
// would index outside it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "executor/data/data_blend.h"
#include "executor/data/tokenizer.h"

namespace megaplan::exec {

struct Vocabulary {
  int64_t size = 0;
  std::string source;  // for people: "--vocab-size", "the tokenizer (hf: tokenizer.json)", ...
};

// `given`: the size --vocab-size or the job file states, with its source. `tokenizer`: the
// tokenizer flags of `train` (none when absent). `data`: the --data-path, each dataset opened to
// read its token range. Throws SpecError("--vocab-size", ...) naming the token and the file when the
// data holds a token outside the chosen vocabulary (SpecError("--data-path", ...) for a negative
// one), the datasets' errors as IndexedDataset's, and the tokenizer's as make_tokenizer's.
Vocabulary training_vocabulary(const std::optional<Vocabulary>& given, const std::optional<TokenizerOptions>& tokenizer,
                               const DataBlend& data);

}  // namespace megaplan::exec
