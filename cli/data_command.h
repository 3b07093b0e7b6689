// The tokenizer flags, as `megaplan data prepare` and `megaplan train` take them.
#pragma once

#include "executor/data/tokenizer.h"

namespace CLI {
class App;
}

namespace megaplan::cli {

// --tokenizer, --tokenizer-type, --vocab-file, --merge-file, --tokenizer-file and
// --tokenizer-model, as `data prepare` and `train` take them.
void add_tokenizer_options(CLI::App& command, exec::TokenizerOptions& options);

}  // namespace megaplan::cli
