// Softmax cross-entropy over the vocabulary with a loss mask, the CPU reference: the loss is the
// masked mean of -log softmax(logits)[target] over the tokens, as Megatron's GPT loss.
#pragma once

#include <cstddef>
#include <cstdint>

namespace megaplan::exec::reference {

// logits[tokens x vocab], targets[tokens], mask[tokens] (0 or 1). Returns the masked mean loss and
// writes each token's loss (0 where masked). Writes probabilities for the backward into `probs`.
double cross_entropy_forward(const float* logits, const int64_t* targets, const float* mask, std::size_t tokens,
                             std::size_t vocab, float* token_losses, float* probs);

// dlogits = (probs - onehot(target)) * mask / sum(mask), scaled by `loss_gradient` (d total/d loss).
void cross_entropy_backward(const float* probs, const int64_t* targets, const float* mask, std::size_t tokens,
                            std::size_t vocab, float loss_gradient, float* dlogits);

}  // namespace megaplan::exec::reference
