// Token and learned position embeddings, the CPU reference, over `count` tokens (batch-major, `seq`
// per sequence). `word` holds vocabulary rows vocab_start .. vocab_start + vocab_rows (a
// vocabulary-parallel shard, or all of them): y[t] = (word[tokens[t] - vocab_start] for the shard's
// tokens, else 0) + position[t % seq]; position may be null (rotary models have none; under tensor
// parallelism one rank adds it).
#pragma once

#include <cstddef>
#include <cstdint>

#include "executor/kernels/token_places.h"

namespace megaplan::exec::reference {

// `seq` tokens of each sequence, whose positions are `places`' (context parallelism; in order by
// default): position[places.place(t % seq)].
void embedding_forward(const int64_t* tokens, std::size_t count, std::size_t seq, const float* word,
                       std::size_t vocab_start, std::size_t vocab_rows, const float* position, std::size_t hidden,
                       float* y, const TokenPlaces& places = {});

// dword[tokens[t] - vocab_start] += dy[t] for the shard's tokens and dposition[place of t] += dy[t]
// (accumulated, as gradients accumulate over microbatches), in token order with double sums per
// row; dposition null: skipped.
void embedding_backward(const float* dy, const int64_t* tokens, std::size_t count, std::size_t seq, std::size_t hidden,
                        std::size_t vocab_start, std::size_t vocab_rows, float* dword, float* dposition,
                        const TokenPlaces& places = {});

}  // namespace megaplan::exec::reference
