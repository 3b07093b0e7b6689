// `megaplan data prepare`: text files to Megatron's indexed dataset (.bin/.idx).
#pragma once

#include <ostream>

#include "executor/data/prepare.h"

namespace megaplan::cli {

struct DataPrepareOptions {
  exec::PrepareOptions prepare;
  exec::TokenizerOptions tokenizer;
};

int run_data_prepare(const DataPrepareOptions& options, std::ostream& out);

}  // namespace megaplan::cli
