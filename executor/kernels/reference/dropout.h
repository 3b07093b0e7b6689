// Dropout of a token-major tensor, the CPU reference: y[r][c] = x[r][c] / (1 - p) where the mask
// keeps element (r, c) of this rank's rows (dropout_mask.h), else 0; plus residual[r][c] where
// residual is non-null (Megatron's dropout-add). y may be x or residual (in place).
#pragma once

#include <cstddef>

#include "executor/kernels/dropout_mask.h"

namespace megaplan::exec::reference {

void dropout(const float* x, const float* residual, std::size_t rows, std::size_t cols, const DropoutMask& mask,
             float* y);

// Attention dropout's factor on the probability of query `query` for key `key` (tokens of the
// sequence) in head `head` of sequence `batch`: 1 / (1 - p) where the mask keeps it, else 0; 1
// where the mask is inactive. The attention references' one reading of the mask.
double probability_factor(const DropoutMask& mask, std::size_t batch, std::size_t head, std::size_t query,
                          std::size_t key);

}  // namespace megaplan::exec::reference
