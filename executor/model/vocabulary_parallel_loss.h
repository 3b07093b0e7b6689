// Megatron's vocabulary-parallel cross entropy after the logits, the same for every backend and
// issued without waiting on the host. Each rank of the tensor-parallel group holds its vocabulary
// shard's logits and their row statistics (Backend::cross_entropy_statistics: the shard's
// log-sum-exp lse_s, the target's logit, 0 where the target lies in another shard, and lse_s again
// as the peak). The group then reduces as Megatron does, with a max and a sum:
//   1. all-reduce MAX of the peak (Megatron's logits_max; a shard's log-sum-exp bounds its largest
//      logit, so every term below is at most 1 and the largest is exactly 1);
//   2. each rank: exp(lse_s - peak), its shard's sum of exp(logit - peak) (cross_entropy_shift);
//   3. all-reduce SUM of those terms and of the target logits: the whole vocabulary's sum of
//      exponentials and the target's logit (Megatron's sum_exp_logits and predicted_logits);
//   4. each rank: lse = peak + log(sum) and the loss (cross_entropy_finish).
// Every rank ends with the same bits: an all-reduce hands every member one result.
#pragma once

#include <cstddef>

#include "executor/comm/comm.h"
#include "executor/runtime/backend.h"

namespace megaplan::exec {

// Steps 1-4 on the backend's `statistics` [lse_s[tokens], target_logit[tokens], peak[tokens]]
// (overwritten; peak is unused without tensor parallelism, where the shard is the whole vocabulary
// and lse = lse_s exactly). Writes the whole vocabulary's lse [tokens] to `lse` and adds the
// microbatch's loss, weighted by each token's share `weights` (host memory, Backend's
// cross_entropy_finish), to *loss_sum, both in backend memory.
void vocabulary_parallel_cross_entropy(Backend& backend, Comm* tensor_parallel, float* statistics, const float* weights,
                                       std::size_t tokens, float* lse, double* loss_sum);

}  // namespace megaplan::exec
