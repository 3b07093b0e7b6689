// Dropout of a token-major tensor, the CPU reference: y[r][c] = x[r][c] / (1 - p) where the mask
// keeps element (r, c) of this rank's rows (dropout_mask.h), else 0; plus residual[r][c] where
// residual is non-null (Megatron's dropout-add). y may be x or residual (in place).
#pragma once

#include <cstddef>

#include "executor/kernels/dropout_mask.h"

namespace megaplan::exec::reference {

void dropout(const float* x, const float* residual, std::size_t rows, std::size_t cols, const DropoutMask& mask,
             float* y);

}  // namespace megaplan::exec::reference
