// Causal scaled-dot-product attention, the CPU reference for the flash-attention kernels: for each
// of `heads` (batch x heads) independent [seq x dim] blocks, o = softmax(q k^T / sqrt(dim), causal) v.
// It keeps the probabilities (heads x seq x seq) for the backward, which flash attention avoids.
#pragma once

#include <cstddef>

namespace megaplan::exec::reference {

void attention_forward(const float* q, const float* k, const float* v, std::size_t heads, std::size_t seq,
                       std::size_t dim, float* o, float* probs);

// dq, dk, dv [heads x seq x dim] from do and the forward's probabilities (overwritten, not accumulated).
void attention_backward(const float* d_o, const float* q, const float* k, const float* v, const float* probs,
                        std::size_t heads, std::size_t seq, std::size_t dim, float* dq, float* dk, float* dv);

}  // namespace megaplan::exec::reference
