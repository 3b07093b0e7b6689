// The last step of Megatron's vocabulary-parallel cross entropy, the same for every backend: each
// tensor-parallel rank's shard of the logits gives per-row statistics (Backend::
// cross_entropy_statistics); the group gathers them and every rank merges them here into the whole
// vocabulary's log-sum-exp and the loss. Megatron all-reduces a max, then sums; gathering the
// rows' (lse, target logit) pairs instead is one collective, and merging them in shard order gives
// every rank the same bits.
#pragma once

#include <cstddef>
#include <vector>

namespace megaplan::exec {

// statistics: `shards` blocks in shard order, each [lse[tokens], target_logit[tokens]].
// Writes the whole vocabulary's lse[tokens] = log sum_s exp(lse_s) and returns the masked mean
// of lse - target logit (the target's logit comes from the one shard that holds it; the others
// give 0). REQUIRES: statistics.size() == shards * 2 * tokens.
double merge_cross_entropy(const std::vector<float>& statistics, std::size_t shards, const float* mask,
                           std::size_t tokens, std::vector<float>& lse);

}  // namespace megaplan::exec
