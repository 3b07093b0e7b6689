// How the GPU kernel tests compare a result with its reference (METHOD.md): the relative L2 error
// ||got - want|| / ||want||, the plain ||got - want|| when want is all zeros, and infinite as soon as
// got holds a non-finite value, so a NaN can never pass as small.
#pragma once

#include <cmath>
#include <vector>

namespace megaplan::test {

template <typename Reference>
double relative_error(const std::vector<float>& got, const std::vector<Reference>& want) {
  if (got.size() != want.size()) return INFINITY;
  double difference = 0, norm = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    const double d = static_cast<double>(got[i]) - static_cast<double>(want[i]);
    difference += d * d;
    norm += static_cast<double>(want[i]) * static_cast<double>(want[i]);
  }
  return norm > 0 ? std::sqrt(difference / norm) : std::sqrt(difference);
}

}  // namespace megaplan::test
