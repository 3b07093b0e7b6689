// Host scalars across a group (the gradient norm's partial sums, the logged loss): collectives
// run on the backend's memory, so the values are staged through a small backend buffer.
#pragma once

#include <vector>

#include "executor/comm/comm.h"
#include "executor/runtime/backend.h"

namespace megaplan::exec {

// Every member's `value`, in group-rank order, bit for bit (gathered, not added), so that each
// member can add them in the same order and reach the same result.
std::vector<double> all_gather_doubles(Comm& group, Backend& backend, double value);

// The sum over members of `value`, added in group-rank order on the host.
double sum_over(Comm& group, Backend& backend, double value);

}  // namespace megaplan::exec
