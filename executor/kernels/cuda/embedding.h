// Token and learned position embeddings on 16-bit tables (bf16 or fp16, as `precision` says): the
// whole word table, or a tensor-parallel rank's shard of a vocabulary-parallel one. The backward is
// deterministic without atomics: the host lists each used table row's token positions in ascending
// order (CSR), and each (row, 8 columns) is summed by a fixed group of threads in a fixed order.
#pragma once

#include <cuda_runtime_api.h>  // cudaStream_t

#include <cstdint>
#include <vector>

#include "core/implementation_options.h"
#include "executor/kernels/cuda/bf16_linear.h"
#include "executor/kernels/token_places.h"

namespace megaplan::exec::cuda {

// y[t] = word[tokens[t]] + position[t % seq] over `count` tokens (position may be null: rotary
// models, or a tensor-parallel rank that leaves it to another). Device pointers; tokens are int32
// on the device, each a row of `word` or -1 for a token another shard holds (no word row:
// y[t] = position[t % seq], or 0). Asynchronous on `stream`, as the backward.
// Token t of each sequence sits at places.place(t) (context parallelism; t by default), which
// position is read (forward) and added to (backward).
void embedding_forward(const int32_t* tokens, int64_t count, int64_t seq, const Half* word, const Half* position,
                       int64_t hidden, Half* y, DType precision, cudaStream_t stream, TokenPlaces places = {});

// Each used table row (ascending) with the positions of its tokens (ascending):
// row_ids[used_rows], row_starts[used_rows + 1], positions[row_starts[used_rows]]. Built on the
// host; -1 tokens (another shard's) are left out, so their positions add to no word row.
struct TokenRows {
  std::vector<int32_t> row_ids, row_starts, positions;
};
TokenRows build_token_rows(const int32_t* host_tokens, int64_t count);

// dword[row] += the sum of dy over its positions (in order); dposition[t] += the sum over the
// batch of dy[b * seq + t] (in batch order; null: skipped). fp32, accumulated as gradients
// accumulate over microbatches. Device pointers (build_token_rows' lists uploaded).
// REQUIRES: count a multiple of seq.
void embedding_backward(const Half* dy, const int32_t* row_ids, const int32_t* row_starts, const int32_t* positions,
                        int64_t used_rows, int64_t count, int64_t seq, int64_t hidden, float* dword, float* dposition,
                        DType precision, cudaStream_t stream, TokenPlaces places = {});

}  // namespace megaplan::exec::cuda
