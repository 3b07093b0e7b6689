#include "executor/model/moe_mlp.h"

#include <algorithm>

namespace megaplan::exec {

std::size_t MoeMlpShape::most_rows() const {
  const std::size_t routes = tokens * router.topk;
  if (capacity.capacity == 0) return routes;
  const std::size_t capacity_rows = router.experts * capacity.capacity;
  return capacity.pad ? capacity_rows : std::min(routes, capacity_rows);
}

MoeMlp::MoeMlp(const MoeMlpShape& shape, Backend& backend)
    : shape_(shape), backend_(backend), most_rows_(shape.most_rows()) {
  const std::size_t rows = most_rows_, t = shape.tokens, h = shape.hidden, f = shape.ffn, s = shape.shared_ffn;
  const std::size_t e = shape.router.experts, k = shape.router.topk;
  activated_ = backend.allocate_activation(rows * f);
  d_activated_ = backend.allocate_activation(std::max(rows * f, t * s));
  d_expert_out_ = backend.allocate_activation(rows * h);
  d_fc1_out_ = backend.allocate_activation(std::max(rows * 2 * f, t * 2 * s));
  d_rows_ = backend.allocate_activation(rows * h);
  d_logits_compute_ = backend.allocate_activation(t * e);
  dx_part_ = backend.allocate_activation(t * h);
  if (s > 0) {
    shared_activated_ = backend.allocate_activation(t * s);
    shared_out_ = backend.allocate_activation(t * h);
  }
  d_probs_ = backend.allocate(t * k);
  d_logits_ = backend.allocate(t * e);
  if (s > 0 && shape.shared_gate) {
    d_gate_ = backend.allocate(t);
    d_gate_compute_ = backend.allocate_activation(t);
  }
}

MoeMlp::~MoeMlp() {
  for (Activation buffer : {activated_, d_activated_, d_expert_out_, d_fc1_out_, d_rows_, d_logits_compute_, dx_part_,
                            shared_activated_, shared_out_, d_gate_compute_}) {
    if (buffer) backend_.release(buffer);
  }
  for (float* buffer : {d_probs_, d_logits_, d_gate_}) {
    if (buffer) backend_.release(buffer);
  }
}

MoeMlpSaved MoeMlp::allocate_saved() {
  const std::size_t t = shape_.tokens, h = shape_.hidden, f = shape_.ffn, k = shape_.router.topk;
  MoeMlpSaved saved;
  saved.logits = backend_.allocate_activation(t * shape_.router.experts);
  saved.rows = backend_.allocate_activation(most_rows_ * h);
  saved.fc1_out = backend_.allocate_activation(most_rows_ * 2 * f);
  saved.expert_out = backend_.allocate_activation(most_rows_ * h);
  if (shape_.shared_ffn > 0) saved.shared_fc1_out = backend_.allocate_activation(t * 2 * shape_.shared_ffn);
  if (shape_.shared_ffn > 0 && shape_.shared_gate) {
    saved.shared_out = backend_.allocate_activation(t * h);
    saved.gate_logits = backend_.allocate_activation(t);
  }
  saved.probs = backend_.allocate(t * k);
  saved.aux_counts = backend_.allocate(shape_.router.experts);
  saved.experts = backend_.allocate_indices(t * k);
  saved.maps.token_rows = backend_.allocate_indices(t * k);
  saved.maps.row_tokens = backend_.allocate_indices(most_rows_);
  return saved;
}

void MoeMlp::release(MoeMlpSaved& saved) {
  for (Activation buffer : {saved.logits, saved.rows, saved.fc1_out, saved.expert_out, saved.shared_fc1_out,
                            saved.shared_out, saved.gate_logits}) {
    if (buffer) backend_.release(buffer);
  }
  backend_.release(saved.probs);
  backend_.release(saved.aux_counts);
  for (int32_t* buffer : {saved.experts, saved.maps.token_rows, saved.maps.row_tokens}) backend_.release(buffer);
  saved = {};
}

template <typename Run>
void MoeMlp::for_each_expert(const MoeMlpSaved& saved, const Run& run) const {
  std::size_t first = 0;
  for (std::size_t expert = 0; expert < saved.rows_per_expert.size(); ++expert) {
    const auto rows = static_cast<std::size_t>(saved.rows_per_expert[expert]);
    if (rows > 0) run(expert, first, rows);
    first += rows;
  }
}

void MoeMlp::forward(ConstActivation x, const MoeMlpWeights& weights, const float* expert_bias, MoeMlpSaved& saved,
                     Activation y, double* loss_sum) {
  Backend& b = backend_;
  const std::size_t t = shape_.tokens, h = shape_.hidden, f = shape_.ffn, k = shape_.router.topk;
  const std::size_t e = shape_.router.experts;
  b.linear_forward(x, weights.router, nullptr, t, h, e, GemmEpilogue::kNone, saved.logits, nullptr);
  b.moe_top_k(saved.logits, t, shape_.router, expert_bias, saved.experts, saved.probs);
  saved.rows_per_expert = b.moe_dispatch(saved.experts, saved.probs, t, shape_.router, shape_.capacity, saved.maps);
  std::size_t rows = 0;
  for (const int64_t n : saved.rows_per_expert) rows += static_cast<std::size_t>(n);
  b.moe_permute(x, h, saved.maps.row_tokens, rows, saved.rows);
  for_each_expert(saved, [&](std::size_t expert, std::size_t first, std::size_t n) {
    b.linear_forward(b.offset(saved.rows, first * h), weights.fc1[expert], nullptr, n, h, 2 * f, GemmEpilogue::kNone,
                     b.offset(saved.fc1_out, first * 2 * f), nullptr);
  });
  b.swiglu_forward(saved.fc1_out, rows, f, activated_);
  for_each_expert(saved, [&](std::size_t expert, std::size_t first, std::size_t n) {
    b.linear_forward(b.offset(activated_, first * f), weights.fc2[expert], nullptr, n, f, h, GemmEpilogue::kNone,
                     b.offset(saved.expert_out, first * h), nullptr);
  });
  b.moe_combine(saved.expert_out, h, saved.maps.token_rows, saved.probs, t, k, y);
  if (shape_.shared_ffn > 0) {
    const std::size_t s = shape_.shared_ffn;
    b.linear_forward(x, weights.shared_fc1, nullptr, t, h, 2 * s, GemmEpilogue::kNone, saved.shared_fc1_out, nullptr);
    b.swiglu_forward(saved.shared_fc1_out, t, s, shared_activated_);
    const Activation shared_out = shape_.shared_gate ? saved.shared_out : shared_out_;
    b.linear_forward(shared_activated_, weights.shared_fc2, nullptr, t, s, h, GemmEpilogue::kNone, shared_out, nullptr);
    if (shape_.shared_gate) {
      b.linear_forward(x, weights.shared_gate, nullptr, t, h, 1, GemmEpilogue::kNone, saved.gate_logits, nullptr);
      b.sigmoid_gated_add(shared_out, saved.gate_logits, t, h, y);
    } else {
      b.add(y, shared_out, t * h, y);
    }
  }
  if (shape_.aux_loss_coeff > 0 && shape_.aux_loss_sequences == 0) {
    b.moe_aux_loss_counts(saved.logits, t, shape_.router, saved.aux_counts);
  }
  router_losses(saved, loss_sum, nullptr, 0);
}

void MoeMlp::router_losses(const MoeMlpSaved& saved, double* loss_sum, float* d_logits, float scale) {
  if (!loss_sum && !d_logits) return;
  const std::size_t t = shape_.tokens;
  if (shape_.aux_loss_coeff > 0 && shape_.aux_loss_sequences > 0) {
    backend_.moe_sequence_aux_loss(saved.logits, t, shape_.aux_loss_sequences, shape_.router, shape_.aux_loss_coeff,
                                   loss_sum, d_logits, scale);
  } else if (shape_.aux_loss_coeff > 0) {
    backend_.moe_switch_loss(saved.logits, t, shape_.router, saved.aux_counts, t, shape_.aux_loss_coeff, loss_sum,
                             d_logits, scale);
  }
  if (shape_.z_loss_coeff > 0) {
    backend_.moe_z_loss(saved.logits, t, shape_.router.experts, shape_.z_loss_coeff, loss_sum, d_logits, scale);
  }
}

void MoeMlp::backward(ConstActivation dy, ConstActivation x, const MoeMlpWeights& weights, const MoeMlpSaved& saved,
                      const MoeMlpGradients& gradients, float loss_gradient_scale, Activation dx) {
  Backend& b = backend_;
  const std::size_t t = shape_.tokens, h = shape_.hidden, f = shape_.ffn, k = shape_.router.topk;
  const std::size_t e = shape_.router.experts;
  std::size_t rows = 0;
  for (const int64_t n : saved.rows_per_expert) rows += static_cast<std::size_t>(n);
  b.moe_combine_backward(dy, saved.expert_out, h, {saved.maps.token_rows, saved.maps.row_tokens}, saved.probs, t, k,
                         rows, d_expert_out_, d_probs_);
  b.swiglu_forward(saved.fc1_out, rows, f, activated_);  // fc2's input again, as the dense MLP's backward
  for_each_expert(saved, [&](std::size_t expert, std::size_t first, std::size_t n) {
    b.linear_backward(b.offset(d_expert_out_, first * h), b.offset(activated_, first * f), weights.fc2[expert], n, f, h,
                      b.offset(d_activated_, first * f), gradients.fc2[expert], nullptr);
  });
  b.swiglu_backward(d_activated_, saved.fc1_out, rows, f, d_fc1_out_);
  for_each_expert(saved, [&](std::size_t expert, std::size_t first, std::size_t n) {
    b.linear_backward(b.offset(d_fc1_out_, first * 2 * f), b.offset(saved.rows, first * h), weights.fc1[expert], n, h,
                      2 * f, b.offset(d_rows_, first * h), gradients.fc1[expert], nullptr);
  });
  b.moe_permute_backward(d_rows_, h, saved.maps.token_rows, t, k, dx);
  // The router: the probabilities' gradient and the losses', through the router GEMM.
  b.fill(d_logits_, t * e, 0.0f);
  b.moe_top_k_backward(saved.logits, t, shape_.router, saved.experts, d_probs_, d_logits_);
  router_losses(saved, nullptr, d_logits_, loss_gradient_scale);
  b.convert(d_logits_, t * e, d_logits_compute_);
  b.linear_backward(d_logits_compute_, x, weights.router, t, h, e, dx_part_, gradients.router, nullptr);
  b.add(dx, dx_part_, t * h, dx);
  if (shape_.shared_ffn > 0) {
    const std::size_t s = shape_.shared_ffn;
    ConstActivation d_shared = dy;
    if (shape_.shared_gate) {  // through sigmoid(x·g): the gate's own gradient reaches g and x
      b.sigmoid_gated_add_backward(dy, saved.shared_out, saved.gate_logits, t, h, shared_out_, d_gate_);
      b.convert(d_gate_, t, d_gate_compute_);
      b.linear_backward(d_gate_compute_, x, weights.shared_gate, t, h, 1, dx_part_, gradients.shared_gate, nullptr);
      b.add(dx, dx_part_, t * h, dx);
      d_shared = shared_out_;
    }
    b.swiglu_forward(saved.shared_fc1_out, t, s, shared_activated_);
    b.linear_backward(d_shared, shared_activated_, weights.shared_fc2, t, s, h, d_activated_, gradients.shared_fc2,
                      nullptr);
    b.swiglu_backward(d_activated_, saved.shared_fc1_out, t, s, d_fc1_out_);
    b.linear_backward(d_fc1_out_, x, weights.shared_fc1, t, h, 2 * s, dx_part_, gradients.shared_fc1, nullptr);
    b.add(dx, dx_part_, t * h, dx);
  }
}

}  // namespace megaplan::exec
