// Token and learned position embeddings, the CPU reference: y[t] = word[tokens[t]] +
// position[t % seq] over `count` tokens (batch-major, `seq` per sequence); position may be null
// (rotary models have none).
#pragma once

#include <cstddef>
#include <cstdint>

namespace megaplan::exec::reference {

void embedding_forward(const int64_t* tokens, std::size_t count, std::size_t seq, const float* word,
                       const float* position, std::size_t hidden, float* y);

// dword[tokens[t]] += dy[t] and dposition[t % seq] += dy[t] (accumulated, as gradients accumulate
// over microbatches), in token order with double sums per row; dposition null: skipped.
void embedding_backward(const float* dy, const int64_t* tokens, std::size_t count, std::size_t seq, std::size_t hidden,
                        float* dword, float* dposition);

}  // namespace megaplan::exec::reference
