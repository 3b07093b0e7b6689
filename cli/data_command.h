// `megaplan data prepare`: text files to Megatron's indexed dataset (.bin/.idx).
#pragma once

#include <ostream>

#include "executor/data/prepare.h"

namespace CLI {
class App;
}

namespace megaplan::cli {

// --tokenizer, --vocab-file, --merge-file, --tokenizer-file and --tokenizer-model, as `data
// prepare` and `train` take them.
void add_tokenizer_options(CLI::App& command, exec::TokenizerOptions& options);

struct DataPrepareOptions {
  exec::PrepareOptions prepare;
  exec::TokenizerOptions tokenizer;
};

int run_data_prepare(const DataPrepareOptions& options, std::ostream& out);

}  // namespace megaplan::cli
