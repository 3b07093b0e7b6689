// `megaplan data prepare`: text files to Megatron's indexed datasets (.bin/.idx), as Megatron-LM's
// tools/preprocess_data.py makes them.
#pragma once

#include <ostream>

#include "executor/data/prepare.h"

namespace CLI {
class App;
}

namespace megaplan::cli {

// --tokenizer, --tokenizer-type, --vocab-file, --merge-file, --tokenizer-file and
// --tokenizer-model, as `data prepare` and `train` take them.
void add_tokenizer_options(CLI::App& command, exec::TokenizerOptions& options);

struct DataPrepareOptions {
  exec::PrepareOptions prepare;
  exec::TokenizerOptions tokenizer;
};

int run_data_prepare(const DataPrepareOptions& options, std::ostream& out);

}  // namespace megaplan::cli
