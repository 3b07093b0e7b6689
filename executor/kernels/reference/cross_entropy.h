// Softmax cross entropy over a vocabulary shard, the CPU reference (Megatron's vocabulary-parallel
// cross entropy; one shard holding the whole vocabulary is the plain loss). The shard's logits
// [tokens x vocab] are columns vocab_start .. vocab_start + vocab of the whole vocabulary; the
// shards' statistics merge into the loss in executor/model/vocabulary_parallel_loss.h.
#pragma once

#include <cstddef>
#include <cstdint>

namespace megaplan::exec::reference {

// Per row: lse[t] = log sum exp(logits[t]) over the shard; target_logit[t] =
// logits[t][targets[t] - vocab_start] where the target is in the shard, else 0.
void cross_entropy_statistics(const float* logits, const int64_t* targets, std::size_t tokens, std::size_t vocab,
                              std::size_t vocab_start, float* lse, float* target_logit);

// With the whole vocabulary's lse: dlogits = (exp(logits - lse) - onehot(target - vocab_start)) *
// weights[t] * loss_gradient (d total / d loss), weights[t] the token's share of the loss (its mask
// over the microbatch's masked tokens). dlogits may be logits.
void cross_entropy_backward(const float* logits, const float* lse, const int64_t* targets, const float* weights,
                            std::size_t tokens, std::size_t vocab, std::size_t vocab_start, float loss_gradient,
                            float* dlogits);

// Merging the shards (executor/model/vocabulary_parallel_loss.h), with `peak` the shards' largest
// lse per row: terms[t] = exp(lse_s[t] - peak[t]) in place of the shard's lse_s.
void cross_entropy_shift(const float* peak, std::size_t tokens, float* shard_lse);

// lse[t] = peak[t] + log(term_sum[t]) (lse = peak where term_sum is null: one shard); returns the
// sum of weights[t] (lse - target): the loss, with the weights a mask over its count.
double cross_entropy_finish(const float* peak, const float* term_sum, const float* target, const float* weights,
                            std::size_t tokens, float* lse);

}  // namespace megaplan::exec::reference
