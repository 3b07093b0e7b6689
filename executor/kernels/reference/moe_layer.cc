#include "executor/kernels/reference/moe_layer.h"

#include <algorithm>
#include <cmath>

#include "core/moe_spec.h"
#include "executor/kernels/reference/swiglu.h"

namespace megaplan::exec::reference {

namespace {

// out [m x n] = a [m x k] · wᵀ, w [n x k].
void times_transposed(const float* a, const float* w, std::size_t m, std::size_t k, std::size_t n, float* out) {
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      double sum = 0;
      for (std::size_t l = 0; l < k; ++l) sum += static_cast<double>(a[i * k + l]) * w[j * k + l];
      out[i * n + j] = static_cast<float>(sum);
    }
  }
}

// The backward of out = a · wᵀ: da [m x k] += dout · w, dw [n x k] += doutᵀ · a.
void times_transposed_backward(const float* dout, const float* a, const float* w, std::size_t m, std::size_t k,
                               std::size_t n, float* da, float* dw) {
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t l = 0; l < k; ++l) {
      double sum = 0;
      for (std::size_t j = 0; j < n; ++j) sum += static_cast<double>(dout[i * n + j]) * w[j * k + l];
      da[i * k + l] += static_cast<float>(sum);
    }
  }
  for (std::size_t j = 0; j < n; ++j) {
    for (std::size_t l = 0; l < k; ++l) {
      double sum = 0;
      for (std::size_t i = 0; i < m; ++i) sum += static_cast<double>(dout[i * n + j]) * a[i * k + l];
      dw[j * k + l] += static_cast<float>(sum);
    }
  }
}

// A SwiGLU MLP over `rows` rows: fc1_out [rows x 2·ffn] kept, out [rows x hidden] written.
void swiglu_mlp_forward(const float* x, const float* fc1, const float* fc2, std::size_t rows, std::size_t hidden,
                        std::size_t ffn, float* fc1_out, float* out) {
  times_transposed(x, fc1, rows, hidden, 2 * ffn, fc1_out);
  std::vector<float> activation(rows * ffn);
  swiglu_forward(fc1_out, rows, ffn, activation.data());
  times_transposed(activation.data(), fc2, rows, ffn, hidden, out);
}

// Its backward from d_out: dx, d_fc1 and d_fc2 added to.
void swiglu_mlp_backward(const float* d_out, const float* x, const float* fc1, const float* fc2, const float* fc1_out,
                         std::size_t rows, std::size_t hidden, std::size_t ffn, float* dx, float* d_fc1, float* d_fc2) {
  std::vector<float> activation(rows * ffn);
  swiglu_forward(fc1_out, rows, ffn, activation.data());
  std::vector<float> d_activation(rows * ffn, 0.0f);
  times_transposed_backward(d_out, activation.data(), fc2, rows, ffn, hidden, d_activation.data(), d_fc2);
  std::vector<float> d_fc1_out(rows * 2 * ffn);
  swiglu_backward(d_activation.data(), fc1_out, rows, ffn, d_fc1_out.data());
  times_transposed_backward(d_fc1_out.data(), x, fc1, rows, hidden, 2 * ffn, dx, d_fc1);
}

double gate_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

std::size_t capacity_of(const MoeLayerShape& shape) {
  return shape.capacity_factor > 0
             ? static_cast<std::size_t>(megaplan::moe_expert_capacity(
                   static_cast<int64_t>(shape.tokens), static_cast<int64_t>(shape.router.topk),
                   static_cast<int64_t>(shape.router.experts), shape.capacity_factor))
             : 0;
}

}  // namespace

MoeLayerForward moe_layer_forward(const float* x, const MoeLayerWeights& weights, const MoeLayerShape& shape) {
  const std::size_t t = shape.tokens, h = shape.hidden, f = shape.ffn, e = shape.router.experts;
  MoeLayerForward out;
  out.logits.resize(t * e);
  times_transposed(x, weights.router, t, h, e, out.logits.data());
  out.routed = route_top_k(out.logits.data(), t, shape.router);
  out.dispatch = dispatch_routes(out.routed, t, e, shape.router.topk, capacity_of(shape), shape.drop_policy,
                                 shape.pad_to_capacity);
  const std::size_t rows = out.dispatch.rows();
  out.rows.resize(rows * h);
  permute_tokens(x, h, out.dispatch, out.rows.data());
  out.fc1_out.resize(rows * 2 * f);
  out.expert_out.resize(rows * h);
  std::size_t first = 0;
  for (std::size_t expert = 0; expert < e; ++expert) {
    const std::size_t n = out.dispatch.by_expert[expert].size();
    swiglu_mlp_forward(out.rows.data() + first * h, weights.fc1 + expert * 2 * f * h, weights.fc2 + expert * h * f, n,
                       h, f, out.fc1_out.data() + first * 2 * f, out.expert_out.data() + first * h);
    first += n;
  }
  out.y.resize(t * h);
  combine_tokens(out.expert_out.data(), h, out.dispatch, out.routed, t, shape.router.topk, out.y.data());
  if (shape.shared_ffn > 0) {
    out.shared_fc1_out.resize(t * 2 * shape.shared_ffn);
    out.shared_out.resize(t * h);
    swiglu_mlp_forward(x, weights.shared_fc1, weights.shared_fc2, t, h, shape.shared_ffn, out.shared_fc1_out.data(),
                       out.shared_out.data());
    if (shape.shared_gate) {
      out.gate_logits.resize(t);
      times_transposed(x, weights.shared_gate, t, h, 1, out.gate_logits.data());
    }
    for (std::size_t i = 0; i < out.y.size(); ++i) {
      const double gate = shape.shared_gate ? gate_sigmoid(out.gate_logits[i / h]) : 1.0;
      out.y[i] = static_cast<float>(out.y[i] + gate * out.shared_out[i]);
    }
  }
  out.tokens_per_expert = aux_loss_tokens_per_expert(out.logits.data(), t, shape.router);
  std::vector<float> unused(t * e, 0.0f);
  if (shape.aux_loss_coeff > 0) {
    out.aux_loss = switch_aux_loss(out.logits.data(), t, shape.router, out.tokens_per_expert, t, shape.aux_loss_coeff,
                                   unused.data());
  }
  if (shape.z_loss_coeff > 0) out.z_loss = z_loss(out.logits.data(), t, e, shape.z_loss_coeff, unused.data());
  return out;
}

MoeLayerGradients moe_layer_backward(const float* dy, const float* x, const MoeLayerWeights& weights,
                                     const MoeLayerShape& shape, const MoeLayerForward& forward) {
  const std::size_t t = shape.tokens, h = shape.hidden, f = shape.ffn, e = shape.router.experts;
  const std::size_t k = shape.router.topk;
  MoeLayerGradients grads;
  grads.dx.assign(t * h, 0.0f);
  grads.router.assign(e * h, 0.0f);
  grads.fc1.assign(e * 2 * f * h, 0.0f);
  grads.fc2.assign(e * h * f, 0.0f);
  const std::size_t rows = forward.dispatch.rows();
  std::vector<float> d_expert_out(rows * h);
  std::vector<float> d_probs(t * k, 0.0f);
  combine_tokens_backward(dy, forward.expert_out.data(), h, forward.dispatch, forward.routed, k, d_expert_out.data(),
                          d_probs.data());
  std::vector<float> d_rows(rows * h, 0.0f);
  std::size_t first = 0;
  for (std::size_t expert = 0; expert < e; ++expert) {
    const std::size_t n = forward.dispatch.by_expert[expert].size();
    swiglu_mlp_backward(d_expert_out.data() + first * h, forward.rows.data() + first * h,
                        weights.fc1 + expert * 2 * f * h, weights.fc2 + expert * h * f,
                        forward.fc1_out.data() + first * 2 * f, n, h, f, d_rows.data() + first * h,
                        grads.fc1.data() + expert * 2 * f * h, grads.fc2.data() + expert * h * f);
    first += n;
  }
  permute_tokens_backward(d_rows.data(), h, forward.dispatch, grads.dx.data());
  std::vector<float> d_logits(t * e, 0.0f);
  route_top_k_backward(forward.logits.data(), forward.routed, d_probs.data(), t, shape.router, d_logits.data());
  if (shape.aux_loss_coeff > 0) {
    switch_aux_loss(forward.logits.data(), t, shape.router, forward.tokens_per_expert, t, shape.aux_loss_coeff,
                    d_logits.data());
  }
  if (shape.z_loss_coeff > 0) z_loss(forward.logits.data(), t, e, shape.z_loss_coeff, d_logits.data());
  times_transposed_backward(d_logits.data(), x, weights.router, t, h, e, grads.dx.data(), grads.router.data());
  if (shape.shared_ffn > 0) {
    grads.shared_fc1.assign(2 * shape.shared_ffn * h, 0.0f);
    grads.shared_fc2.assign(h * shape.shared_ffn, 0.0f);
    // Through the gate: the shared output's gradient sigmoid(x·g)·dy, the gate logit's
    // sigmoid'(x·g)·Σ dy·shared_out, which reaches g and x through x·g.
    std::vector<float> d_shared(dy, dy + t * h);
    if (shape.shared_gate) {
      std::vector<float> d_gate(t);
      for (std::size_t token = 0; token < t; ++token) {
        const double gate = gate_sigmoid(forward.gate_logits[token]);
        double dot = 0;
        for (std::size_t i = token * h; i < (token + 1) * h; ++i) {
          dot += static_cast<double>(dy[i]) * forward.shared_out[i];
          d_shared[i] = static_cast<float>(gate * dy[i]);
        }
        d_gate[token] = static_cast<float>(dot * gate * (1 - gate));
      }
      grads.shared_gate.assign(h, 0.0f);
      times_transposed_backward(d_gate.data(), x, weights.shared_gate, t, h, 1, grads.dx.data(),
                                grads.shared_gate.data());
    }
    swiglu_mlp_backward(d_shared.data(), x, weights.shared_fc1, weights.shared_fc2, forward.shared_fc1_out.data(), t, h,
                        shape.shared_ffn, grads.dx.data(), grads.shared_fc1.data(), grads.shared_fc2.data());
  }
  return grads;
}

}  // namespace megaplan::exec::reference
