// Memory per pipeline rank as a text table: what each holds at its peak, in GiB.
#pragma once

#include <string>
#include <vector>

#include "core/memory_model.h"

namespace megaplan {

// Columns: rank, weights, gradients, optimizer, activations (the schedule's in-flight
// microbatches), transient (one microbatch's logits or a recomputed layer), allocator, reserve,
// total; every figure GiB with two decimals.
std::string memory_table(const std::vector<PipelineRankMemory>& memory);

}  // namespace megaplan
