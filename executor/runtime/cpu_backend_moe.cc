// The CPU backend's mixture-of-experts operations: kernels/reference/moe_router.h on the flat
// buffers the Backend passes (moe_routing.h's maps), fp32 with double accumulation.
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "executor/kernels/reference/moe_router.h"
#include "executor/runtime/cpu_backend.h"

namespace megaplan::exec {

namespace {

const float* values(ConstActivation a) { return reinterpret_cast<const float*>(a); }
float* values(Activation a) { return reinterpret_cast<float*>(a); }

reference::RouterOptions options_of(const MoeRouter& router, const float* expert_bias = nullptr) {
  reference::RouterOptions options;
  options.experts = router.experts;
  options.topk = router.topk;
  options.score = router.sigmoid ? reference::RouterScore::kSigmoid : reference::RouterScore::kSoftmax;
  options.pre_softmax = router.pre_softmax;
  options.scaling_factor = router.scaling_factor;
  options.expert_bias = expert_bias;
  return options;
}

reference::TopK top_k_of(const int32_t* experts, const float* probs, std::size_t routes) {
  reference::TopK routed;
  routed.experts.assign(experts, experts + routes);
  if (probs) routed.probs.assign(probs, probs + routes);
  return routed;
}

// The maps as one list of the rows in order (what permute and combine walk): each row's token and
// its slot in the token's top k, -1 for a pad row.
reference::Dispatch rows_in_order(ConstMoeDispatchMaps maps, std::size_t tokens, std::size_t topk, std::size_t rows) {
  std::vector<reference::Route> routes(rows);
  for (std::size_t r = 0; r < rows; ++r) routes[r] = {maps.row_tokens[r], -1};
  for (std::size_t t = 0; t < tokens; ++t) {
    for (std::size_t j = 0; j < topk; ++j) {
      const int32_t row = maps.token_rows[t * topk + j];
      if (row >= 0) routes[static_cast<std::size_t>(row)].slot = static_cast<int32_t>(j);
    }
  }
  reference::Dispatch dispatch;
  dispatch.by_expert.push_back(std::move(routes));
  return dispatch;
}

std::vector<int64_t> counts_of(const float* counts, std::size_t experts) {
  std::vector<int64_t> whole(experts);
  for (std::size_t i = 0; i < experts; ++i) whole[i] = static_cast<int64_t>(counts[i]);
  return whole;
}

// A loss's value into *loss_sum and its gradient times `scale` into d_logits, either one optional:
// `loss(d)` adds its unscaled gradient to d and returns the value.
template <typename Loss>
void add_loss(std::size_t gradient_size, double* loss_sum, float* d_logits, float scale, const Loss& loss) {
  std::vector<float> gradient(gradient_size, 0.0f);
  const double value = loss(gradient.data());
  if (loss_sum) *loss_sum += value;
  if (!d_logits) return;
  for (std::size_t i = 0; i < gradient_size; ++i) d_logits[i] += scale * gradient[i];
}

}  // namespace

int32_t* CpuBackend::allocate_indices(std::size_t n) {
  auto buffer = std::make_unique<int32_t[]>(std::max<std::size_t>(n, 1));  // zeros
  int32_t* raw = buffer.get();
  index_buffers_.emplace(raw, IndexBuffer{std::move(buffer), n});
  bytes_ += static_cast<int64_t>(n * sizeof(int32_t));
  peak_bytes_ = std::max(peak_bytes_, bytes_);
  return raw;
}

void CpuBackend::release(int32_t* buffer) {
  const auto found = index_buffers_.find(buffer);
  if (found == index_buffers_.end()) return;
  bytes_ -= static_cast<int64_t>(found->second.size * sizeof(int32_t));
  index_buffers_.erase(found);
}

void CpuBackend::moe_top_k(ConstActivation logits, std::size_t tokens, const MoeRouter& router,
                           const float* expert_bias, int32_t* experts, float* probs) {
  const reference::TopK routed = reference::route_top_k(values(logits), tokens, options_of(router, expert_bias));
  std::copy(routed.experts.begin(), routed.experts.end(), experts);
  std::copy(routed.probs.begin(), routed.probs.end(), probs);
}

void CpuBackend::moe_top_k_backward(ConstActivation logits, std::size_t tokens, const MoeRouter& router,
                                    const int32_t* experts, const float* d_probs, float* d_logits) {
  reference::route_top_k_backward(values(logits), top_k_of(experts, nullptr, tokens * router.topk), d_probs, tokens,
                                  options_of(router), d_logits);
}

void CpuBackend::moe_count_routes(const int32_t* experts, std::size_t routes, std::size_t expert_count, float* counts) {
  for (std::size_t i = 0; i < routes; ++i) {
    if (experts[i] >= 0 && static_cast<std::size_t>(experts[i]) < expert_count) counts[experts[i]] += 1;
  }
}

std::vector<int64_t> CpuBackend::moe_dispatch(const int32_t* experts, const float* probs, std::size_t tokens,
                                              const MoeRouter& router, const MoeCapacity& capacity,
                                              MoeDispatchMaps maps) {
  const std::size_t k = router.topk;
  const reference::Dispatch dispatch =
      reference::dispatch_routes(top_k_of(experts, probs, tokens * k), tokens, router.experts, k, capacity.capacity,
                                 capacity.policy, capacity.pad);
  std::fill_n(maps.token_rows, tokens * k, -1);
  std::vector<int64_t> rows_per_expert;
  int32_t row = 0;
  for (const std::vector<reference::Route>& routes : dispatch.by_expert) {
    rows_per_expert.push_back(static_cast<int64_t>(routes.size()));
    for (const reference::Route& route : routes) {
      maps.row_tokens[row] = static_cast<int32_t>(route.token);
      if (route.slot >= 0) maps.token_rows[static_cast<std::size_t>(route.token) * k + route.slot] = row;
      ++row;
    }
  }
  return rows_per_expert;
}

void CpuBackend::moe_permute(ConstActivation x, std::size_t hidden, const int32_t* row_tokens, std::size_t rows,
                             Activation out) {
  for (std::size_t r = 0; r < rows; ++r) {
    std::copy_n(values(x) + static_cast<std::size_t>(row_tokens[r]) * hidden, hidden, values(out) + r * hidden);
  }
}

namespace {
// out [tokens x hidden] = Σ over each token's kept routes of (probs ? its probability : 1) · its row.
void sum_routes(const float* rows, std::size_t hidden, const int32_t* token_rows, const float* probs,
                std::size_t tokens, std::size_t topk, float* out) {
  std::vector<double> sum(hidden);
  for (std::size_t t = 0; t < tokens; ++t) {
    std::fill(sum.begin(), sum.end(), 0.0);
    for (std::size_t j = 0; j < topk; ++j) {
      const int32_t row = token_rows[t * topk + j];
      if (row < 0) continue;
      const float* route = rows + static_cast<std::size_t>(row) * hidden;
      const double weight = probs ? probs[t * topk + j] : 1.0;
      for (std::size_t h = 0; h < hidden; ++h) sum[h] += weight * route[h];
    }
    for (std::size_t h = 0; h < hidden; ++h) out[t * hidden + h] = static_cast<float>(sum[h]);
  }
}
}  // namespace

void CpuBackend::moe_permute_backward(ConstActivation d_rows, std::size_t hidden, const int32_t* token_rows,
                                      std::size_t tokens, std::size_t topk, Activation dx) {
  sum_routes(values(d_rows), hidden, token_rows, nullptr, tokens, topk, values(dx));
}

void CpuBackend::moe_combine(ConstActivation rows, std::size_t hidden, const int32_t* token_rows, const float* probs,
                             std::size_t tokens, std::size_t topk, Activation y) {
  sum_routes(values(rows), hidden, token_rows, probs, tokens, topk, values(y));
}

void CpuBackend::moe_combine_backward(ConstActivation dy, ConstActivation rows, std::size_t hidden,
                                      ConstMoeDispatchMaps maps, const float* probs, std::size_t tokens,
                                      std::size_t topk, std::size_t rows_count, Activation d_rows, float* d_probs) {
  std::fill_n(d_probs, tokens * topk, 0.0f);
  reference::TopK routed;  // what the backward reads of it: the probabilities
  routed.probs.assign(probs, probs + tokens * topk);
  reference::combine_tokens_backward(values(dy), values(rows), hidden, rows_in_order(maps, tokens, topk, rows_count),
                                     routed, topk, values(d_rows), d_probs);
}

void CpuBackend::moe_aux_loss_counts(ConstActivation logits, std::size_t tokens, const MoeRouter& router,
                                     float* counts) {
  const std::vector<int64_t> whole = reference::aux_loss_tokens_per_expert(values(logits), tokens, options_of(router));
  for (std::size_t i = 0; i < whole.size(); ++i) counts[i] = static_cast<float>(whole[i]);
}

void CpuBackend::moe_switch_loss(ConstActivation logits, std::size_t tokens, const MoeRouter& router,
                                 const float* counts, std::size_t total_tokens, double coeff, double* loss_sum,
                                 float* d_logits, float gradient_scale) {
  add_loss(tokens * router.experts, loss_sum, d_logits, gradient_scale, [&](float* d) {
    return reference::switch_aux_loss(values(logits), tokens, options_of(router), counts_of(counts, router.experts),
                                      total_tokens, coeff, d);
  });
}

void CpuBackend::moe_sequence_aux_loss(ConstActivation logits, std::size_t tokens, std::size_t sequences,
                                       const MoeRouter& router, double coeff, double* loss_sum, float* d_logits,
                                       float gradient_scale) {
  add_loss(tokens * router.experts, loss_sum, d_logits, gradient_scale, [&](float* d) {
    return reference::sequence_aux_loss(values(logits), tokens, sequences, options_of(router), coeff, d);
  });
}

void CpuBackend::moe_z_loss(ConstActivation logits, std::size_t tokens, std::size_t experts, double coeff,
                            double* loss_sum, float* d_logits, float gradient_scale) {
  add_loss(tokens * experts, loss_sum, d_logits, gradient_scale,
           [&](float* d) { return reference::z_loss(values(logits), tokens, experts, coeff, d); });
}

void CpuBackend::moe_update_expert_bias(const float* counts, std::size_t experts, float rate, float* expert_bias) {
  reference::update_expert_bias(counts_of(counts, experts), rate, expert_bias);
}

namespace {
double sigmoid_of(double x) { return 1.0 / (1.0 + std::exp(-x)); }
}  // namespace

void CpuBackend::sigmoid_gated_add(ConstActivation x, ConstActivation gate, std::size_t rows, std::size_t cols,
                                   Activation y) {
  for (std::size_t r = 0; r < rows; ++r) {
    const double g = sigmoid_of(values(gate)[r]);
    for (std::size_t c = r * cols; c < (r + 1) * cols; ++c) {
      values(y)[c] = static_cast<float>(values(y)[c] + g * values(x)[c]);
    }
  }
}

void CpuBackend::sigmoid_gated_add_backward(ConstActivation dy, ConstActivation x, ConstActivation gate,
                                            std::size_t rows, std::size_t cols, Activation dx, float* d_gate) {
  for (std::size_t r = 0; r < rows; ++r) {
    const double g = sigmoid_of(values(gate)[r]);
    double dot = 0;
    for (std::size_t c = r * cols; c < (r + 1) * cols; ++c) {
      dot += static_cast<double>(values(dy)[c]) * values(x)[c];
      values(dx)[c] = static_cast<float>(g * values(dy)[c]);
    }
    d_gate[r] = static_cast<float>(dot * g * (1 - g));
  }
}

}  // namespace megaplan::exec
