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
// mask / sum(mask) * loss_gradient (d total / d loss). dlogits may be logits.
void cross_entropy_backward(const float* logits, const float* lse, const int64_t* targets, const float* mask,
                            std::size_t tokens, std::size_t vocab, std::size_t vocab_start, float loss_gradient,
                            float* dlogits);

}  // namespace megaplan::exec::reference
