// Rotary position embeddings (RoPE), the CPU reference, in Megatron's default non-interleaved
// "rotate half" form: within each head the first rotary_dim dims are two halves (x1, x2) whose
// i-th pair rotates by the angle t * f_i, f_i = theta^(-2i / rotary_dim) scaled as
// rope_frequency.h says, t the token's position in its sequence; dims from rotary_dim on pass
// through. Angles and rotation in double.
#pragma once

#include <cstddef>

#include "executor/kernels/rope_frequency.h"
#include "executor/kernels/token_places.h"

namespace megaplan::exec::reference {

// In place on `heads` heads of each token: element (b, t, h, d) at
// base[(b * seq + t) * token_stride + h * head_dim + d]. inverse = true rotates by the negative
// angle: RoPE's backward (a rotation's transpose is its inverse). Token t of each sequence turns by
// its place, places.place(t) (context parallelism; t itself by default).
// REQUIRES: rotary_dim even, rotary_dim <= head_dim.
void rope_apply(float* base, std::size_t batch, std::size_t seq, std::size_t heads, std::size_t head_dim,
                std::size_t token_stride, std::size_t rotary_dim, const RotaryFrequencies& frequencies, bool inverse,
                const TokenPlaces& places = {});

}  // namespace megaplan::exec::reference
