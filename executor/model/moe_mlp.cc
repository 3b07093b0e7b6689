#include "executor/model/moe_mlp.h"

#include <cstring>

#include "executor/model/recipe_buffers.h"

namespace megaplan::exec {

MoeDims MoeMlpShape::dims() const {
  const auto i64 = [](std::size_t n) { return static_cast<int64_t>(n); };
  MoeDims d;
  d.tokens = i64(tokens);
  d.hidden = i64(hidden);
  d.ffn = i64(ffn);
  d.shared_ffn = i64(shared_ffn);
  d.shared_gate = shared_gate && shared_ffn > 0;
  d.experts = i64(router.experts);
  d.topk = i64(router.topk);
  d.capacity = i64(capacity.capacity);
  d.most_rows = moe_most_rows(d.tokens, d.topk, d.experts, d.capacity, capacity.pad);
  return d;
}

MoeMlp::MoeMlp(const MoeMlpShape& shape, Backend& backend) : shape_(shape), backend_(backend), dims_(shape.dims()) {
  allocate_buffers(backend, moe_scratch(dims_), scratch_);
  balancing_sum_ = reinterpret_cast<double*>(scratch_.loss_memory);  // allocations are at least 16-byte aligned
  z_sum_ = balancing_sum_ + 1;
}

MoeMlp::~MoeMlp() { release_buffers(backend_, scratch_); }

MoeMlpSaved MoeMlp::allocate_saved() {
  MoeMlpSaved saved;
  allocate_buffers(backend_, moe_kept(dims_), saved);
  return saved;
}

void MoeMlp::release(MoeMlpSaved& saved) {
  release_buffers(backend_, saved);
  saved.rows_per_expert.clear();
}

RouterLosses MoeMlp::take_losses() {
  float words[2 * kLossSumFloats];
  backend_.download(words, scratch_.loss_memory, 2 * kLossSumFloats);
  RouterLosses losses;
  std::memcpy(&losses.balancing, words, sizeof(double));
  std::memcpy(&losses.z, words + kLossSumFloats, sizeof(double));
  backend_.fill(scratch_.loss_memory, 2 * kLossSumFloats, 0.0f);
  return losses;
}

namespace {
// The rows the forward's dispatch made.
std::size_t dispatched_rows(const MoeMlpSaved& saved) {
  std::size_t rows = 0;
  for (const int64_t n : saved.rows_per_expert) rows += static_cast<std::size_t>(n);
  return rows;
}
}  // namespace

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
                     Activation y, bool add_losses) {
  Backend& b = backend_;
  MoeScratch<Activation, float*>& s = scratch_;
  const std::size_t t = shape_.tokens, h = shape_.hidden, f = shape_.ffn, k = shape_.router.topk;
  const std::size_t e = shape_.router.experts;
  b.linear_forward(x, weights.router, nullptr, t, h, e, GemmEpilogue::kNone, saved.logits, nullptr);
  b.moe_top_k(saved.logits, t, shape_.router, expert_bias, saved.experts, saved.probs);
  saved.rows_per_expert = b.moe_dispatch(saved.experts, saved.probs, t, shape_.router, shape_.capacity,
                                         {saved.token_rows, saved.row_tokens});
  const std::size_t rows = dispatched_rows(saved);
  b.moe_permute(x, h, saved.row_tokens, rows, saved.rows);
  for_each_expert(saved, [&](std::size_t expert, std::size_t first, std::size_t n) {
    b.linear_forward(b.offset(saved.rows, first * h), weights.fc1[expert], nullptr, n, h, 2 * f, GemmEpilogue::kNone,
                     b.offset(saved.fc1_out, first * 2 * f), nullptr);
  });
  b.swiglu_forward(saved.fc1_out, rows, f, s.activated);
  for_each_expert(saved, [&](std::size_t expert, std::size_t first, std::size_t n) {
    b.linear_forward(b.offset(s.activated, first * f), weights.fc2[expert], nullptr, n, f, h, GemmEpilogue::kNone,
                     b.offset(saved.expert_out, first * h), nullptr);
  });
  b.moe_combine(saved.expert_out, h, saved.token_rows, saved.probs, t, k, y);
  if (shape_.shared_ffn > 0) {
    const std::size_t w = shape_.shared_ffn;
    b.linear_forward(x, weights.shared_fc1, nullptr, t, h, 2 * w, GemmEpilogue::kNone, saved.shared_fc1_out, nullptr);
    b.swiglu_forward(saved.shared_fc1_out, t, w, s.shared_activated);
    const Activation shared_out = dims_.shared_gate ? saved.shared_out : s.shared_out;
    b.linear_forward(s.shared_activated, weights.shared_fc2, nullptr, t, w, h, GemmEpilogue::kNone, shared_out,
                     nullptr);
    if (dims_.shared_gate) {
      b.linear_forward(x, weights.shared_gate, nullptr, t, h, 1, GemmEpilogue::kNone, saved.gate_logits, nullptr);
      b.sigmoid_gated_add(shared_out, saved.gate_logits, t, h, y);
    } else {
      b.add(y, shared_out, t * h, y);
    }
  }
  if (shape_.aux_loss_coeff > 0 && shape_.aux_loss_sequences == 0) {
    b.moe_aux_loss_counts(saved.logits, t, shape_.router, saved.aux_counts);
  }
  if (!add_losses) return;
  // The values alone, at a coefficient of 1: Megatron logs each loss over its coefficient.
  if (shape_.aux_loss_coeff > 0 && shape_.aux_loss_sequences > 0) {
    b.moe_sequence_aux_loss(saved.logits, t, shape_.aux_loss_sequences, shape_.router, 1.0, balancing_sum_, nullptr, 0);
  } else if (shape_.aux_loss_coeff > 0) {
    b.moe_switch_loss(saved.logits, t, shape_.router, saved.aux_counts, t, 1.0, balancing_sum_, nullptr, 0);
  }
  if (shape_.z_loss_coeff > 0) b.moe_z_loss(saved.logits, t, e, 1.0, z_sum_, nullptr, 0);
}

void MoeMlp::router_loss_gradients(const MoeMlpSaved& saved, float* d_logits, float scale) {
  const std::size_t t = shape_.tokens;
  if (shape_.aux_loss_coeff > 0 && shape_.aux_loss_sequences > 0) {
    backend_.moe_sequence_aux_loss(saved.logits, t, shape_.aux_loss_sequences, shape_.router, shape_.aux_loss_coeff,
                                   nullptr, d_logits, scale);
  } else if (shape_.aux_loss_coeff > 0) {
    backend_.moe_switch_loss(saved.logits, t, shape_.router, saved.aux_counts, t, shape_.aux_loss_coeff, nullptr,
                             d_logits, scale);
  }
  if (shape_.z_loss_coeff > 0) {
    backend_.moe_z_loss(saved.logits, t, shape_.router.experts, shape_.z_loss_coeff, nullptr, d_logits, scale);
  }
}

void MoeMlp::backward(ConstActivation dy, ConstActivation x, const MoeMlpWeights& weights, const MoeMlpSaved& saved,
                      const MoeMlpGradients& gradients, float loss_gradient_scale, Activation dx) {
  Backend& b = backend_;
  MoeScratch<Activation, float*>& s = scratch_;
  const std::size_t t = shape_.tokens, h = shape_.hidden, f = shape_.ffn, k = shape_.router.topk;
  const std::size_t e = shape_.router.experts;
  const std::size_t rows = dispatched_rows(saved);
  b.moe_combine_backward(dy, saved.expert_out, h, {saved.token_rows, saved.row_tokens}, saved.probs, t, k, rows,
                         s.d_expert_out, s.d_probs);
  b.swiglu_forward(saved.fc1_out, rows, f, s.activated);  // fc2's input again, as the dense MLP's backward
  for_each_expert(saved, [&](std::size_t expert, std::size_t first, std::size_t n) {
    b.linear_backward(b.offset(s.d_expert_out, first * h), b.offset(s.activated, first * f), weights.fc2[expert], n, f,
                      h, b.offset(s.d_activated, first * f), gradients.fc2[expert], nullptr);
  });
  b.swiglu_backward(s.d_activated, saved.fc1_out, rows, f, s.d_fc1_out);
  for_each_expert(saved, [&](std::size_t expert, std::size_t first, std::size_t n) {
    b.linear_backward(b.offset(s.d_fc1_out, first * 2 * f), b.offset(saved.rows, first * h), weights.fc1[expert], n, h,
                      2 * f, b.offset(s.d_rows, first * h), gradients.fc1[expert], nullptr);
  });
  b.moe_permute_backward(s.d_rows, h, saved.token_rows, t, k, dx);
  // The router: the probabilities' gradient and the losses', through the router GEMM.
  b.fill(s.d_logits, t * e, 0.0f);
  b.moe_top_k_backward(saved.logits, t, shape_.router, saved.experts, s.d_probs, s.d_logits);
  router_loss_gradients(saved, s.d_logits, loss_gradient_scale);
  b.convert(s.d_logits, t * e, s.d_logits_compute);
  b.linear_backward(s.d_logits_compute, x, weights.router, t, h, e, s.dx_part, gradients.router, nullptr);
  b.add(dx, s.dx_part, t * h, dx);
  if (shape_.shared_ffn > 0) {
    const std::size_t w = shape_.shared_ffn;
    ConstActivation d_shared = dy;
    if (dims_.shared_gate) {  // through sigmoid(x·g): the gate's own gradient reaches g and x
      b.sigmoid_gated_add_backward(dy, saved.shared_out, saved.gate_logits, t, h, s.shared_out, s.d_gate);
      b.convert(s.d_gate, t, s.d_gate_compute);
      b.linear_backward(s.d_gate_compute, x, weights.shared_gate, t, h, 1, s.dx_part, gradients.shared_gate, nullptr);
      b.add(dx, s.dx_part, t * h, dx);
      d_shared = s.shared_out;
    }
    b.swiglu_forward(saved.shared_fc1_out, t, w, s.shared_activated);
    b.linear_backward(d_shared, s.shared_activated, weights.shared_fc2, t, w, h, s.d_activated, gradients.shared_fc2,
                      nullptr);
    b.swiglu_backward(s.d_activated, saved.shared_fc1_out, t, w, s.d_fc1_out);
    b.linear_backward(s.d_fc1_out, x, weights.shared_fc1, t, h, 2 * w, s.dx_part, gradients.shared_fc1, nullptr);
    b.add(dx, s.dx_part, t * h, dx);
  }
}

}  // namespace megaplan::exec
