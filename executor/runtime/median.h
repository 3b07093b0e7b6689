// The median the profilers report: the upper middle of an even count, so that it is one of the
// samples (a time that was measured, not an average of two).
#pragma once

#include <algorithm>
#include <vector>

namespace megaplan::exec {

// REQUIRES: !values.empty().
inline double median_of(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2), values.end());
  return values[values.size() / 2];
}

}  // namespace megaplan::exec
