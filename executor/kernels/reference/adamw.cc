#include "executor/kernels/reference/adamw.h"

#include <cmath>

namespace megaplan::exec::reference {

void adamw_step(float* weights, const float* gradients, float* first_moment, float* second_moment, std::size_t n,
                int64_t step, const AdamWParameters& p) {
  const double correction1 = 1.0 - std::pow(p.beta1, static_cast<double>(step));
  const double correction2 = 1.0 - std::pow(p.beta2, static_cast<double>(step));
  for (std::size_t i = 0; i < n; ++i) {
    const double g = gradients[i];
    const double m = p.beta1 * first_moment[i] + (1.0 - p.beta1) * g;
    const double v = p.beta2 * second_moment[i] + (1.0 - p.beta2) * g * g;
    first_moment[i] = static_cast<float>(m);
    second_moment[i] = static_cast<float>(v);
    const double update = (m / correction1) / (std::sqrt(v / correction2) + p.eps) + p.weight_decay * weights[i];
    weights[i] = static_cast<float>(weights[i] - p.lr * update);
  }
}

}  // namespace megaplan::exec::reference
