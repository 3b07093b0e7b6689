// Ring attention's pieces (context parallelism, core/context_parallel.h), the CPU reference for the
// flash-attention kernels' block form: one block of queries against one block of keys and values,
// each at its own place in the sequence, with each query row's log-sum-exp; the merge of a block
// into the rows' running result; and a block's share of the backward given the merged forward.
// Layouts as attention.h: `heads` independent blocks, q [heads x q_len x dim], k and v
// [heads x kv_len x dim]; block h is head `head` + h of sequence `batch` for dropout's mask, which
// is drawn at the tokens' places in the whole sequence, so the blocks draw the single rank's mask.
#pragma once

#include <cstddef>

#include "executor/kernels/dropout_mask.h"

namespace megaplan::exec::reference {

// Where a block's tokens lie in the sequence: query row i is token q_first + i, key row j token
// kv_first + j; a key after its query is masked (causal).
struct BlockPlaces {
  std::size_t q_first = 0;
  std::size_t kv_first = 0;
};

// o [heads x q_len x dim]: the block's attention normalised over its own visible keys; lse
// [heads x q_len]: the log of that normaliser over the scaled scores (-inf, and o 0, for a row that
// sees no key of the block).
void attention_block_forward(const float* q, const float* k, const float* v, std::size_t heads, std::size_t q_len,
                             std::size_t kv_len, std::size_t dim, BlockPlaces places, const DropoutMask& dropout,
                             std::size_t batch, std::size_t head, float* o, float* lse);

// Folds a block's (o, lse) of `rows` query rows a head into the rows' running (o, lse): the merged
// rows are those of attention over both blocks' keys together. A running lse of -inf takes the
// block as it is.
void merge_attention_block(float* o, float* lse, const float* block_o, const float* block_lse, std::size_t heads,
                           std::size_t rows, std::size_t dim);

// The block's share of the gradient, added to dq [heads x q_len x dim] and dk, dv [heads x kv_len x
// dim], from d_o and the forward's o and lse merged over every block (the softmax's normaliser is
// the whole row's).
void attention_block_backward(const float* d_o, const float* q, const float* k, const float* v, const float* o,
                              const float* lse, std::size_t heads, std::size_t q_len, std::size_t kv_len,
                              std::size_t dim, BlockPlaces places, const DropoutMask& dropout, std::size_t batch,
                              std::size_t head, float* dq, float* dk, float* dv);

}  // namespace megaplan::exec::reference
