// Megatron's vocabulary-parallel cross entropy after the logits, the same for every backend. Each
// rank of the tensor-parallel group holds its vocabulary shard's logits and their row statistics
// (Backend::cross_entropy_statistics: the shard's log-sum-exp lse_s and the target's logit, 0 where
// the target lies in another shard). The group then reduces as Megatron does, with a max and a sum:
//   1. all-reduce MAX of lse_s: peak (Megatron's logits_max; a shard's log-sum-exp bounds its largest
//      logit, so every term below is at most 1 and the largest is exactly 1);
//   2. each rank: exp(lse_s - peak), its shard's sum of exp(logit - peak) (shift_by_peak);
//   3. all-reduce SUM of those terms and of the target logits: the whole vocabulary's sum of
//      exponentials and the target's logit (Megatron's sum_exp_logits and predicted_logits);
//   4. each rank: lse = peak + log(sum) and the loss (finish_cross_entropy).
// Every rank ends with the same bits: an all-reduce hands every member one result.
#pragma once

#include <cstddef>
#include <vector>

#include "executor/comm/comm.h"
#include "executor/runtime/backend.h"

namespace megaplan::exec {

// Steps 1-4 on the backend's `statistics` [lse_s[tokens], target_logit[tokens]] (overwritten);
// `tensor_parallel` is null without tensor parallelism (then the shard is the whole vocabulary and
// lse = lse_s exactly). Writes the whole vocabulary's lse [tokens] to `lse` on the host and returns
// the masked mean loss.
double vocabulary_parallel_cross_entropy(Backend& backend, Comm* tensor_parallel, float* statistics,
                                         const float* mask, std::size_t tokens, std::vector<float>& lse);

// Step 2: terms[t] = exp(shard_lse[t] - peak[t]) (terms may be shard_lse).
void shift_by_peak(const float* shard_lse, const float* peak, std::size_t tokens, float* terms);

// Step 4: lse[t] = peak[t] + log(term_sum[t]); returns the mean of lse - target over the tokens
// whose mask is 1 (0 when none is).
double finish_cross_entropy(const float* peak, const float* term_sum, const float* target, const float* mask,
                            std::size_t tokens, std::vector<float>& lse);

}  // namespace megaplan::exec
