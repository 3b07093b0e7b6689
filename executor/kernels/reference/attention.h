// Causal scaled-dot-product attention, the CPU reference for the flash-attention kernels: for each
// of `heads` independent [seq x dim] blocks, o = (softmax(q k^T / sqrt(dim), causal) ∘ Z) v, with Z
// attention dropout's mask (dropout_mask.h) scaled by 1 / (1 - p): block h is head `head` + h of
// sequence `batch` (1 everywhere where the mask is inactive). It keeps the undropped probabilities
// (heads x seq x seq) for the backward, which flash attention avoids.
#pragma once

#include <cstddef>

#include "executor/kernels/dropout_mask.h"

namespace megaplan::exec::reference {

void attention_forward(const float* q, const float* k, const float* v, std::size_t heads, std::size_t seq,
                       std::size_t dim, const DropoutMask& dropout, std::size_t batch, std::size_t head, float* o,
                       float* probs);

// dq, dk, dv [heads x seq x dim] from do and the forward's probabilities (overwritten, not
// accumulated), the forward's mask drawn again.
void attention_backward(const float* d_o, const float* q, const float* k, const float* v, const float* probs,
                        std::size_t heads, std::size_t seq, std::size_t dim, const DropoutMask& dropout,
                        std::size_t batch, std::size_t head, float* dq, float* dk, float* dv);

}  // namespace megaplan::exec::reference
