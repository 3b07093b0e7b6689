// AdamW with decoupled weight decay, as torch.optim.AdamW and Megatron's optimizer step it, on fp32
// master weights: m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; w -= lr (m_hat / (sqrt(v_hat) + eps)
// + wd w), with bias corrections m_hat = m / (1 - b1^t), v_hat = v / (1 - b2^t). The CPU reference.
#pragma once

#include <cstddef>
#include <cstdint>

namespace megaplan::exec::reference {

struct AdamWParameters {
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // 0 for biases and norms (Megatron's no-decay group)
};

// One step (`step` counts from 1) over n parameters.
void adamw_step(float* weights, const float* gradients, float* first_moment, float* second_moment, std::size_t n,
                int64_t step, const AdamWParameters& parameters);

}  // namespace megaplan::exec::reference
