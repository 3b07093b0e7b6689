// Softmax cross-entropy over a (padded) vocabulary on bf16 logits, one block per token row: the
// forward keeps each row's log-sum-exp so the backward needs no second reduction over the row.
#pragma once

#include <cstdint>

#include "executor/kernels/cuda/bf16_linear.h"

namespace megaplan::exec::cuda {

// logits [tokens x row_stride] bf16 whose first `vocab` columns are real (Megatron pads the
// vocabulary; padded columns are never read). targets int32 in [0, vocab), mask fp32 (0 or 1).
// Writes lse[t] (fp32 log-sum-exp of the row) and losses[t] = mask[t] * (lse[t] - logit[t][target[t]]).
// REQUIRES: 0 < vocab <= row_stride; all pointers on the device.
void cross_entropy_forward(const Bf16* logits, int64_t tokens, int64_t vocab, int64_t row_stride,
                           const int32_t* targets, const float* mask, float* lse, float* losses);

// dlogits = scale * mask[t] * (softmax(row) - onehot(target)) as bf16; padded columns set to 0.
// dlogits may EQUAL logits (in place, so the [tokens x vocab] gradient needs no second buffer):
// with the forward's lse each element depends only on itself, and each thread reads an element
// before it writes that same element. Rows whose scale * mask is 0 are written as zeros unread.
void cross_entropy_backward(const Bf16* logits, int64_t tokens, int64_t vocab, int64_t row_stride,
                            const int32_t* targets, const float* mask, const float* lse, float scale, Bf16* dlogits);

}  // namespace megaplan::exec::cuda
