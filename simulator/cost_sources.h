// Where the simulator's kernel and transfer times came from.
#pragma once

#include <cstdint>

namespace megaplan::sim {

// Where kernel and transfer times came from: a measured table, or the roofline / link fallback.
struct CostSources {
  int64_t table = 0;
  int64_t fallback = 0;
};

}  // namespace megaplan::sim
