// Softmax cross entropy over a (padded) vocabulary, or a tensor-parallel rank's shard of it, on
// 16-bit logits (bf16 or fp16, as `precision` says), one block per token row: the forward gives
// each row's log-sum-exp and target logit (merged over the shards on the host), so the backward
// needs no second reduction over the row.
#pragma once

#include <cuda_runtime_api.h>  // cudaStream_t

#include <cstdint>

#include "core/implementation_options.h"
#include "executor/kernels/cuda/bf16_linear.h"

namespace megaplan::exec::cuda {

// logits [tokens x row_stride] 16-bit values whose first `vocab` columns are real (Megatron pads the
// vocabulary; padded columns are never read). targets int32: the target's column in [0, vocab),
// or -1 where another shard holds it. Writes, fp32, lse[t] = log sum exp of the row's `vocab`
// columns and target_logit[t] = logit[t][targets[t]] (0 for -1), and lse again to `peak` unless
// it is null. Asynchronous on `stream`, as the backward.
// REQUIRES: 0 < vocab <= row_stride; all pointers on the device.
void cross_entropy_statistics(const Half* logits, int64_t tokens, int64_t vocab, int64_t row_stride,
                              const int32_t* targets, float* lse, float* target_logit, float* peak, DType precision,
                              cudaStream_t stream);

// The shards merged (executor/model/vocabulary_parallel_loss.h), as the CPU reference computes
// them: shard_lse[t] = exp(shard_lse[t] - peak[t]) in double.
void cross_entropy_shift(const float* peak, int64_t tokens, float* shard_lse, cudaStream_t stream);
// lse[t] = peak[t] + log(term_sum[t]) (peak where term_sum is null), in double; *loss_sum += the
// sum of weights[t] (lse - target) (each token's share of the loss). One block.
void cross_entropy_finish(const float* peak, const float* term_sum, const float* target, const float* weights,
                          int64_t tokens, float* lse, double* loss_sum, cudaStream_t stream);

// dlogits = scale * weights[t] * (exp(logit - lse[t]) - onehot(targets[t])) in 16 bits, with lse the
// whole vocabulary's (the shards' merged; the forward's own with one shard); a -1 target has no
// onehot in this shard. Padded columns set to 0.
// dlogits may EQUAL logits (in place, so the [tokens x vocab] gradient needs no second buffer):
// with lse given each element depends only on itself, and each thread reads an element before it
// writes that same element. Rows whose scale * weight is 0 are written as zeros unread.
void cross_entropy_backward(const Half* logits, int64_t tokens, int64_t vocab, int64_t row_stride,
                            const int32_t* targets, const float* weights, const float* lse, float scale, Half* dlogits,
                            DType precision, cudaStream_t stream);

}  // namespace megaplan::exec::cuda
