#include "executor/kernels/reference/moe_router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace megaplan::exec::reference {

namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Softmax of one row of `n` logits into `out`.
void softmax_row(const float* logits, std::size_t n, std::vector<double>& out) {
  out.resize(n);
  const double most = *std::max_element(logits, logits + n);
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += out[i] = std::exp(static_cast<double>(logits[i]) - most);
  for (double& value : out) value /= sum;
}

// The `k` largest of `scores`, descending, ties to the lower index.
std::vector<int32_t> top_k(const std::vector<double>& scores, std::size_t k) {
  std::vector<int32_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return scores[static_cast<std::size_t>(a)] > scores[static_cast<std::size_t>(b)];
  });
  order.resize(k);
  return order;
}

// The scores the aux loss reads: softmax over every expert, or the sigmoids normalised to sum 1
// (Megatron adds 1e-20 to the sum).
void aux_scores(const float* logits, const RouterOptions& options, std::vector<double>& scores) {
  if (options.score == RouterScore::kSoftmax) {
    softmax_row(logits, options.experts, scores);
    return;
  }
  scores.resize(options.experts);
  double sum = 0;
  for (std::size_t i = 0; i < options.experts; ++i) sum += scores[i] = sigmoid(logits[i]);
  for (double& score : scores) score /= sum + 1e-20;
}

}  // namespace

TopK route_top_k(const float* logits, std::size_t tokens, const RouterOptions& options) {
  const std::size_t e = options.experts;
  const std::size_t k = options.topk;
  TopK routed;
  routed.experts.resize(tokens * k);
  routed.probs.resize(tokens * k);
  std::vector<double> scores(e);
  std::vector<double> probs(k);
  for (std::size_t t = 0; t < tokens; ++t) {
    const float* row = logits + t * e;
    std::vector<int32_t> chosen;
    if (options.score == RouterScore::kSoftmax) {
      if (options.pre_softmax) {
        softmax_row(row, e, scores);
        chosen = top_k(scores, k);
        for (std::size_t j = 0; j < k; ++j) probs[j] = scores[static_cast<std::size_t>(chosen[j])];
      } else {
        for (std::size_t i = 0; i < e; ++i) scores[i] = row[i];
        chosen = top_k(scores, k);
        std::vector<float> picked(k);
        for (std::size_t j = 0; j < k; ++j) picked[j] = row[chosen[j]];
        softmax_row(picked.data(), k, probs);
      }
    } else {
      std::vector<double> sigmoids(e);
      for (std::size_t i = 0; i < e; ++i) {
        sigmoids[i] = sigmoid(row[i]);
        scores[i] = sigmoids[i] + (options.expert_bias ? options.expert_bias[i] : 0.0f);
      }
      chosen = top_k(scores, k);
      double sum = 0;
      for (std::size_t j = 0; j < k; ++j) sum += probs[j] = sigmoids[static_cast<std::size_t>(chosen[j])];
      if (k > 1)
        for (double& p : probs) p /= sum + 1e-20;
    }
    for (std::size_t j = 0; j < k; ++j) {
      routed.experts[t * k + j] = chosen[j];
      routed.probs[t * k + j] = static_cast<float>(probs[j] * options.scaling_factor);
    }
  }
  return routed;
}

void route_top_k_backward(const float* logits, const TopK& routed, const float* d_probs, std::size_t tokens,
                          const RouterOptions& options, float* d_logits) {
  const std::size_t e = options.experts;
  const std::size_t k = options.topk;
  std::vector<double> scores;
  for (std::size_t t = 0; t < tokens; ++t) {
    const float* row = logits + t * e;
    float* d_row = d_logits + t * e;
    const int32_t* chosen = routed.experts.data() + t * k;
    const auto g = [&](std::size_t j) { return static_cast<double>(d_probs[t * k + j]) * options.scaling_factor; };
    if (options.score == RouterScore::kSoftmax && options.pre_softmax) {
      // p_i = s_i for the chosen i of s = softmax(z): dz_m = s_m (g_m [m chosen] - Σ_chosen g_i s_i).
      softmax_row(row, e, scores);
      double dot = 0;
      for (std::size_t j = 0; j < k; ++j) dot += g(j) * scores[static_cast<std::size_t>(chosen[j])];
      for (std::size_t m = 0; m < e; ++m) d_row[m] -= static_cast<float>(scores[m] * dot);
      for (std::size_t j = 0; j < k; ++j) {
        const auto m = static_cast<std::size_t>(chosen[j]);
        d_row[m] += static_cast<float>(scores[m] * g(j));
      }
    } else if (options.score == RouterScore::kSoftmax) {
      // p = softmax over the chosen logits: dz_j = p_j (g_j - Σ p g), nothing for the others.
      std::vector<float> picked(k);
      for (std::size_t j = 0; j < k; ++j) picked[j] = row[chosen[j]];
      std::vector<double> p;
      softmax_row(picked.data(), k, p);
      double dot = 0;
      for (std::size_t j = 0; j < k; ++j) dot += p[j] * g(j);
      for (std::size_t j = 0; j < k; ++j) d_row[chosen[j]] += static_cast<float>(p[j] * (g(j) - dot));
    } else {
      // p_j = σ_j / (Σ_chosen σ + 1e-20) for k > 1, else σ_j; dσ/dz = σ(1 - σ).
      std::vector<double> s(k);
      double sum = 0;
      for (std::size_t j = 0; j < k; ++j) sum += s[j] = sigmoid(row[chosen[j]]);
      double dot = 0;
      for (std::size_t j = 0; j < k; ++j) dot += g(j) * s[j];
      const double denominator = sum + 1e-20;
      for (std::size_t j = 0; j < k; ++j) {
        const double d_sigmoid = k > 1 ? g(j) / denominator - dot / (denominator * denominator) : g(j);
        d_row[chosen[j]] += static_cast<float>(d_sigmoid * s[j] * (1 - s[j]));
      }
    }
  }
}

std::vector<int64_t> aux_loss_tokens_per_expert(const float* logits, std::size_t tokens, const RouterOptions& options) {
  std::vector<int64_t> counts(options.experts, 0);
  std::vector<double> scores;
  for (std::size_t t = 0; t < tokens; ++t) {
    aux_scores(logits + t * options.experts, options, scores);
    for (const int32_t expert : top_k(scores, options.topk)) ++counts[static_cast<std::size_t>(expert)];
  }
  return counts;
}

double switch_aux_loss(const float* logits, std::size_t tokens, const RouterOptions& options,
                       const std::vector<int64_t>& tokens_per_expert, std::size_t total_tokens, double coeff,
                       float* d_logits) {
  const std::size_t e = options.experts;
  const double t_total = static_cast<double>(total_tokens);
  const double scale = static_cast<double>(e) * coeff / (static_cast<double>(options.topk) * t_total * t_total);
  double loss = 0;
  std::vector<double> scores;
  std::vector<double> w(e);  // d loss / d score_i
  for (std::size_t i = 0; i < e; ++i) w[i] = scale * static_cast<double>(tokens_per_expert[i]);
  for (std::size_t t = 0; t < tokens; ++t) {
    const float* row = logits + t * e;
    float* d_row = d_logits + t * e;
    aux_scores(row, options, scores);
    double dot = 0;
    for (std::size_t i = 0; i < e; ++i) dot += w[i] * scores[i];
    loss += dot;
    if (options.score == RouterScore::kSoftmax) {
      for (std::size_t m = 0; m < e; ++m) d_row[m] += static_cast<float>(scores[m] * (w[m] - dot));
      continue;
    }
    // q_i = σ_i / (Σσ + 1e-20): dq/dσ_j = (w_j - Σ w_i q_i) / (Σσ + 1e-20); dσ/dz = σ(1 - σ).
    double sum = 0;
    for (std::size_t i = 0; i < e; ++i) sum += sigmoid(row[i]);
    for (std::size_t m = 0; m < e; ++m) {
      const double s = sigmoid(row[m]);
      d_row[m] += static_cast<float>((w[m] - dot) / (sum + 1e-20) * s * (1 - s));
    }
  }
  return loss;
}

double sequence_aux_loss(const float* logits, std::size_t tokens, std::size_t sequences, const RouterOptions& options,
                         double coeff, float* d_logits) {
  const std::size_t length = tokens / sequences, e = options.experts;
  double loss = 0;
  // Each sequence's switch loss with coeff / sequences: the mean's value and gradient at once.
  for (std::size_t b = 0; b < sequences; ++b) {
    const float* rows = logits + b * length * e;
    loss += switch_aux_loss(rows, length, options, aux_loss_tokens_per_expert(rows, length, options), length,
                            coeff / static_cast<double>(sequences), d_logits + b * length * e);
  }
  return loss;
}

double z_loss(const float* logits, std::size_t tokens, std::size_t experts, double coeff, float* d_logits) {
  double loss = 0;
  std::vector<double> softmax;
  for (std::size_t t = 0; t < tokens; ++t) {
    const float* row = logits + t * experts;
    const double most = *std::max_element(row, row + experts);
    double sum = 0;
    for (std::size_t i = 0; i < experts; ++i) sum += std::exp(static_cast<double>(row[i]) - most);
    const double lse = most + std::log(sum);
    loss += lse * lse;
    softmax_row(row, experts, softmax);
    const double factor = coeff * 2 * lse / static_cast<double>(tokens);
    for (std::size_t i = 0; i < experts; ++i) d_logits[t * experts + i] += static_cast<float>(factor * softmax[i]);
  }
  return coeff * loss / static_cast<double>(tokens);
}

std::size_t Dispatch::rows() const {
  std::size_t rows = 0;
  for (const std::vector<Route>& routes : by_expert) rows += routes.size();
  return rows;
}

Dispatch dispatch_routes(const TopK& routed, std::size_t tokens, std::size_t experts, std::size_t topk,
                         std::size_t capacity, DropPolicy policy, bool pad) {
  Dispatch dispatch;
  dispatch.by_expert.resize(experts);
  for (std::size_t t = 0; t < tokens; ++t) {
    for (std::size_t j = 0; j < topk; ++j) {
      dispatch.by_expert[static_cast<std::size_t>(routed.experts[t * topk + j])].push_back(
          {static_cast<int64_t>(t), static_cast<int32_t>(j)});
    }
  }
  if (capacity == 0) return dispatch;  // dropless
  for (std::vector<Route>& routes : dispatch.by_expert) {
    if (routes.size() > capacity) {
      if (policy == DropPolicy::kProbs) {
        const auto prob = [&](const Route& r) {
          return routed.probs[static_cast<std::size_t>(r.token) * topk + static_cast<std::size_t>(r.slot)];
        };
        std::stable_sort(routes.begin(), routes.end(),
                         [&](const Route& a, const Route& b) { return prob(a) > prob(b); });
      }
      routes.resize(capacity);
      std::sort(routes.begin(), routes.end(), [](const Route& a, const Route& b) { return a.token < b.token; });
    }
    if (!pad) continue;
    // The earliest tokens not routed here fill the rest, merged in token order.
    std::vector<Route> padded;
    std::size_t next = 0;
    for (int64_t t = 0; t < static_cast<int64_t>(tokens) && padded.size() < capacity; ++t) {
      if (next < routes.size() && routes[next].token == t) {
        padded.push_back(routes[next++]);
      } else if (padded.size() + (routes.size() - next) < capacity) {
        padded.push_back({t, -1});
      }
    }
    routes = std::move(padded);
  }
  return dispatch;
}

void permute_tokens(const float* x, std::size_t hidden, const Dispatch& dispatch, float* rows) {
  for (const std::vector<Route>& routes : dispatch.by_expert) {
    for (const Route& route : routes) {
      std::copy_n(x + static_cast<std::size_t>(route.token) * hidden, hidden, rows);
      rows += hidden;
    }
  }
}

void permute_tokens_backward(const float* d_rows, std::size_t hidden, const Dispatch& dispatch, float* dx) {
  for (const std::vector<Route>& routes : dispatch.by_expert) {
    for (const Route& route : routes) {
      float* d_token = dx + static_cast<std::size_t>(route.token) * hidden;
      for (std::size_t h = 0; h < hidden; ++h) d_token[h] += d_rows[h];
      d_rows += hidden;
    }
  }
}

void combine_tokens(const float* rows, std::size_t hidden, const Dispatch& dispatch, const TopK& routed,
                    std::size_t tokens, std::size_t topk, float* y) {
  std::vector<double> sums(tokens * hidden, 0.0);
  for (const std::vector<Route>& routes : dispatch.by_expert) {
    for (const Route& route : routes) {
      if (route.slot >= 0) {
        const auto t = static_cast<std::size_t>(route.token);
        const double prob = routed.probs[t * topk + static_cast<std::size_t>(route.slot)];
        for (std::size_t h = 0; h < hidden; ++h) sums[t * hidden + h] += prob * rows[h];
      }
      rows += hidden;
    }
  }
  for (std::size_t i = 0; i < sums.size(); ++i) y[i] = static_cast<float>(sums[i]);
}

void combine_tokens_backward(const float* dy, const float* rows, std::size_t hidden, const Dispatch& dispatch,
                             const TopK& routed, std::size_t topk, float* d_rows, float* d_probs) {
  for (const std::vector<Route>& routes : dispatch.by_expert) {
    for (const Route& route : routes) {
      const auto t = static_cast<std::size_t>(route.token);
      const float* d_token = dy + t * hidden;
      if (route.slot < 0) {
        std::fill_n(d_rows, hidden, 0.0f);
      } else {
        const std::size_t at = t * topk + static_cast<std::size_t>(route.slot);
        double dot = 0;
        for (std::size_t h = 0; h < hidden; ++h) {
          d_rows[h] = routed.probs[at] * d_token[h];
          dot += static_cast<double>(d_token[h]) * rows[h];
        }
        d_probs[at] += static_cast<float>(dot);
      }
      rows += hidden;
      d_rows += hidden;
    }
  }
}

void update_expert_bias(const std::vector<int64_t>& tokens_per_expert, double rate, float* expert_bias) {
  const double mean =
      static_cast<double>(std::accumulate(tokens_per_expert.begin(), tokens_per_expert.end(), int64_t{0})) /
      static_cast<double>(tokens_per_expert.size());
  for (std::size_t i = 0; i < tokens_per_expert.size(); ++i) {
    const double offset = mean - static_cast<double>(tokens_per_expert[i]);
    const double sign = offset > 0 ? 1.0 : offset < 0 ? -1.0 : 0.0;
    expert_bias[i] = static_cast<float>(expert_bias[i] + sign * rate);
  }
}

}  // namespace megaplan::exec::reference
