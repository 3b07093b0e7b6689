// What the CPU reference-kernel tests share: random inputs, and a backward checked against
// central finite differences of its forward.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

namespace megaplan::test {

inline std::vector<float> random_vector(std::size_t n, std::mt19937& generator, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(n);
  for (float& value : values) value = normal(generator);
  return values;
}

// Checks `analytic` against d loss / d values[i] by central differences, on a sample of entries.
inline void check_gradient(std::vector<float>& values, const std::vector<float>& analytic,
                           const std::function<double()>& loss, const char* what) {
  REQUIRE(values.size() == analytic.size());
  const float step = 1e-2f;
  for (std::size_t i = 0; i < values.size(); i += 1 + values.size() / 23) {
    const float saved = values[i];
    values[i] = saved + step;
    const double up = loss();
    values[i] = saved - step;
    const double down = loss();
    values[i] = saved;
    const double numeric = (up - down) / (2.0 * step);
    INFO(what << "[" << i << "]: analytic " << analytic[i] << ", numeric " << numeric);
    CHECK(std::abs(analytic[i] - numeric) <= 2e-2 + 2e-2 * std::abs(numeric));
  }
}

// sum_i values[i] * weights[i]: a scalar loss whose gradient with respect to the values is `weights`.
inline double weighted_sum(const std::vector<float>& values, const std::vector<float>& weights) {
  double sum = 0;
  for (std::size_t i = 0; i < values.size(); ++i) sum += static_cast<double>(values[i]) * weights[i];
  return sum;
}

}  // namespace megaplan::test
