// The leave-one-out check of a profile's GEMM and attention tables (Profile::leave_one_out): the
// interpolation the simulator costs every shape with, asked for each measured point with that
// point left out. Where it misses, the grid is too sparse there.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/gemm.h"
#include "simulator/profile.h"

namespace megaplan::sim {

namespace {

// "name value" pairs of a point's shape, the values rounded back from their logs.
std::string shape_text(const std::array<double, 3>& log_shape, const std::array<const char*, 3>& names) {
  std::ostringstream out;
  for (std::size_t d = 0; d < 3; ++d) out << (d ? " " : "") << names[d] << " " << std::llround(std::exp(log_shape[d]));
  return out.str();
}

}  // namespace

std::vector<InterpolationCheck> Profile::leave_one_out() const {
  std::vector<InterpolationCheck> checks;
  const auto check = [&](const std::string& table, const std::vector<ShapePoint>& points,
                         const std::array<const char*, 3>& names) {
    if (points.size() < 2) return;
    std::vector<double> errors;
    InterpolationCheck result;
    result.table = table;
    result.points = static_cast<int64_t>(points.size());
    std::vector<ShapePoint> others;
    for (std::size_t i = 0; i < points.size(); ++i) {
      others.assign(points.begin(), points.end());
      others.erase(others.begin() + static_cast<std::ptrdiff_t>(i));
      const ShapePoint& point = points[i];
      const double flops = std::exp(point.log_throughput) * point.seconds;
      // No memory floor: the check is of the interpolation alone.
      const double predicted = shape_lookup(others, point.log_shape, flops, 0);
      const double error = std::abs(predicted - point.seconds) / point.seconds;
      if (error > result.max_error) {
        result.max_error = error;
        result.worst = shape_text(point.log_shape, names);
      }
      errors.push_back(error);
    }
    std::sort(errors.begin(), errors.end());
    result.median_error = errors[(errors.size() - 1) / 2];
    // Nearest rank: the smallest error at or above 95% of the points.
    const auto rank = static_cast<std::size_t>(std::ceil(0.95 * static_cast<double>(errors.size())));
    result.p95_error = errors[std::max<std::size_t>(rank, 1) - 1];
    checks.push_back(result);
  };
  for (const auto& [key, points] : gemm_) {
    const auto& [dtype, layout, epilogue] = key;
    check("gemm " + to_string(dtype) + " " + to_string(layout) + " " + to_string(epilogue), points, {"m", "n", "k"});
  }
  for (const auto* pass : {&attention_forward_, &attention_backward_}) {
    const std::string name = pass == &attention_forward_ ? "attention forward" : "attention backward";
    for (const bool causal : {false, true}) {
      for (const bool dropout : {false, true}) {
        for (const auto& [gqa_ratio, points] : (*pass)[causal][dropout]) {
          check(name + (causal ? " causal" : "") + (dropout ? " dropout" : "") + " gqa " + std::to_string(gqa_ratio),
                points, {"batch_heads", "seq", "head_dim"});
        }
      }
    }
  }
  return checks;
}

}  // namespace megaplan::sim
