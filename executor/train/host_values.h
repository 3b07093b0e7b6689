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

// Every member's list, in group-rank order; the lists may differ in length. Each double travels as
// its two 32-bit words, so values come back bit for bit.
std::vector<std::vector<double>> all_gather_lists(Comm& group, Backend& backend, const std::vector<double>& values);

}  // namespace megaplan::exec
