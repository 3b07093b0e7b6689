#include "executor/model/moe_mlp.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "executor/model/recipe_buffers.h"

namespace megaplan::exec {

MoeDims MoeMlpShape::dims(int64_t expert_parallel) const {
  const auto i64 = [](std::size_t n) { return static_cast<int64_t>(n); };
  return moe_dims(i64(tokens), i64(hidden), i64(ffn), i64(shared_ffn), shared_gate, i64(router.experts),
                  i64(router.topk), i64(capacity.capacity), capacity.pad, expert_parallel);
}

MoeMlp::MoeMlp(const MoeMlpShape& shape, Backend& backend, Comm* expert_parallel)
    : shape_(shape),
      backend_(backend),
      expert_parallel_(expert_parallel && expert_parallel->size() > 1 ? expert_parallel : nullptr),
      dims_(shape.dims(expert_parallel_ ? expert_parallel_->size() : 1)) {
  if (dims_.experts % dims_.expert_parallel != 0) {
    throw std::logic_error("MoeMlp: " + std::to_string(dims_.experts) + " experts over " +
                           std::to_string(dims_.expert_parallel) + " expert-parallel ranks");
  }
  allocate_buffers(backend, moe_scratch(dims_), scratch_);
  allocate_buffers(backend, moe_expert_scratch(dims_), expert_scratch_);
  balancing_sum_ = reinterpret_cast<double*>(scratch_.loss_memory);  // allocations are at least 16-byte aligned
  z_sum_ = balancing_sum_ + 1;
}

MoeMlp::~MoeMlp() {
  release_buffers(backend_, scratch_);
  release_buffers(backend_, expert_scratch_);
}

MoeMlpSaved MoeMlp::allocate_saved() {
  MoeMlpSaved saved;
  allocate_buffers(backend_, moe_kept(dims_), saved);
  if (!expert_parallel_) {  // a dispatch's rows at most: the forward's are known at ep 1
    allocate_buffers(backend_, moe_expert_kept(dims_), saved.expert);
    saved.expert_rows_held = static_cast<std::size_t>(dims_.expert_rows);
  }
  return saved;
}

void MoeMlp::release(MoeMlpSaved& saved) {
  release_buffers(backend_, saved);
  release_buffers(backend_, saved.expert);
  saved.expert_rows_held = 0;
  saved.rows_per_expert.clear();
  saved.received.clear();
}

RouterLosses MoeMlp::take_losses() {
  float words[2 * kLossSumFloats];
  backend_.download(words, scratch_.loss_memory, 2 * kLossSumFloats);
  RouterLosses losses;
  std::memcpy(&losses.balancing, words, sizeof(double));
  std::memcpy(&losses.z, words + kLossSumFloats, sizeof(double));
  backend_.fill(scratch_.loss_memory, 2 * kLossSumFloats, 0.0f);
  losses.expert_load_by_layer = std::move(expert_load_by_layer_);
  expert_load_by_layer_.clear();
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

std::vector<int64_t> MoeMlp::local_rows(const MoeMlpSaved& saved) const {
  if (!expert_parallel_) return saved.rows_per_expert;
  const auto local = static_cast<std::size_t>(dims_.local_experts());
  std::vector<int64_t> rows(local, 0);
  for (std::size_t i = 0; i < saved.received.size(); ++i) rows[i % local] += saved.received[i];
  return rows;
}

template <typename Run>
void MoeMlp::for_each_expert(const MoeMlpSaved& saved, const Run& run) const {
  const std::vector<int64_t> rows_per_expert = local_rows(saved);
  std::size_t first = 0;
  for (std::size_t expert = 0; expert < rows_per_expert.size(); ++expert) {
    const auto rows = static_cast<std::size_t>(rows_per_expert[expert]);
    if (rows > 0) run(expert, first, rows);
    first += rows;
  }
}

namespace {
// The busiest expert's rows over the mean (1 when nothing was dispatched).
double max_over_mean(const std::vector<double>& rows) {
  double most = 0, sum = 0;
  for (const double n : rows) {
    most = std::max(most, n);
    sum += n;
  }
  return sum > 0 ? most * static_cast<double>(rows.size()) / sum : 1.0;
}
}  // namespace

std::size_t MoeMlp::exchange_counts(MoeMlpSaved& saved) {
  Comm& ep = *expert_parallel_;
  const auto experts = static_cast<std::size_t>(dims_.experts), local = static_cast<std::size_t>(dims_.local_experts());
  const auto members = static_cast<std::size_t>(ep.size()), rank = static_cast<std::size_t>(ep.rank());
  // Counts travel as fp32, exact below 2^24 rows: a dispatch makes at most tokens x topk.
  std::vector<float> counts(members * experts);
  for (std::size_t e = 0; e < experts; ++e) {
    if (saved.rows_per_expert[e] >= (int64_t{1} << 24)) {
      throw std::logic_error("MoeMlp: an expert's rows exceed 2^24 in one dispatch");
    }
    counts[e] = static_cast<float>(saved.rows_per_expert[e]);
  }
  float* mine = scratch_.counts + rank * experts;
  backend_.upload(mine, counts.data(), experts);
  ep.all_gather(mine, scratch_.counts, experts, DType::kFloat32)->wait();
  backend_.download(counts.data(), scratch_.counts, members * experts);
  std::vector<double> group_rows(experts, 0.0);  // every member's rows of each expert
  for (std::size_t i = 0; i < counts.size(); ++i) group_rows[i % experts] += counts[i];
  saved.group_load = max_over_mean(group_rows);
  saved.received.assign(members * local, 0);
  std::size_t rows = 0;
  for (std::size_t q = 0; q < members; ++q) {
    for (std::size_t j = 0; j < local; ++j) {
      saved.received[q * local + j] = static_cast<int64_t>(counts[q * experts + rank * local + j]);
      rows += static_cast<std::size_t>(saved.received[q * local + j]);
    }
  }
  return rows;
}

Request MoeMlp::exchange(const MoeMlpSaved& saved, ConstActivation input, Activation output, bool returning) {
  Comm& ep = *expert_parallel_;
  const auto local = static_cast<std::size_t>(dims_.local_experts()), h = shape_.hidden;
  const auto members = static_cast<std::size_t>(ep.size());
  // Elements to each member from the dispatch (its experts' rows), and from each member to the experts.
  std::vector<std::size_t> dispatched(members, 0), arrived(members, 0);
  for (std::size_t p = 0; p < members; ++p) {
    for (std::size_t j = 0; j < local; ++j) {
      dispatched[p] += static_cast<std::size_t>(saved.rows_per_expert[p * local + j]) * h;
      arrived[p] += static_cast<std::size_t>(saved.received[p * local + j]) * h;
    }
  }
  return returning ? ep.all_to_all(input, arrived, output, dispatched, backend_.activation_type())
                   : ep.all_to_all(input, dispatched, output, arrived, backend_.activation_type());
}

void MoeMlp::regroup(const MoeMlpSaved& saved, Activation from, Activation to, bool by_expert) {
  const auto local = static_cast<std::size_t>(dims_.local_experts()), h = shape_.hidden;
  const std::size_t members = saved.received.size() / local;
  // Each (sender, expert) run's first row in both orders.
  std::vector<std::size_t> by_sender(saved.received.size()), by_expert_first(saved.received.size());
  std::size_t row = 0;
  for (std::size_t i = 0; i < saved.received.size(); ++i) {
    by_sender[i] = row;
    row += static_cast<std::size_t>(saved.received[i]);
  }
  row = 0;
  for (std::size_t j = 0; j < local; ++j) {
    for (std::size_t q = 0; q < members; ++q) {
      by_expert_first[q * local + j] = row;
      row += static_cast<std::size_t>(saved.received[q * local + j]);
    }
  }
  for (std::size_t i = 0; i < saved.received.size(); ++i) {
    const auto n = static_cast<std::size_t>(saved.received[i]);
    if (n == 0) continue;
    const std::size_t source = by_expert ? by_sender[i] : by_expert_first[i];
    const std::size_t target = by_expert ? by_expert_first[i] : by_sender[i];
    backend_.copy(backend_.offset(from, source * h), n * h, backend_.offset(to, target * h));
  }
}

void MoeMlp::reserve_expert_rows(std::size_t rows) {
  if (static_cast<int64_t>(rows) <= dims_.expert_rows) return;
  release_buffers(backend_, expert_scratch_);
  dims_.expert_rows = moe_expert_rows(static_cast<int64_t>(rows), dims_.most_rows);
  allocate_buffers(backend_, moe_expert_scratch(dims_), expert_scratch_);
}

void MoeMlp::forward(ConstActivation x, const MoeMlpWeights& weights, const float* expert_bias, MoeMlpSaved& saved,
                     Activation y, bool add_losses, int64_t layer) {
  Backend& b = backend_;
  MoeScratch<Activation, float*>& s = scratch_;
  const std::size_t t = shape_.tokens, h = shape_.hidden, f = shape_.ffn, k = shape_.router.topk;
  const std::size_t e = shape_.router.experts;
  b.linear_forward(x, weights.router, nullptr, t, h, e, GemmEpilogue::kNone, saved.logits, nullptr);
  b.moe_top_k(saved.logits, t, shape_.router, expert_bias, saved.experts, saved.probs);
  saved.rows_per_expert = b.moe_dispatch(saved.experts, saved.probs, t, shape_.router, shape_.capacity,
                                         {saved.token_rows, saved.row_tokens});
  const std::size_t rows = dispatched_rows(saved);
  // The rows this rank's experts compute, and buffers holding them.
  const std::size_t expert_rows = expert_parallel_ ? exchange_counts(saved) : rows;
  if (saved.expert_rows_held < expert_rows) {
    release_buffers(b, saved.expert);
    MoeDims held = dims_;
    held.expert_rows = moe_expert_rows(static_cast<int64_t>(expert_rows), dims_.most_rows);
    allocate_buffers(b, moe_expert_kept(held), saved.expert);
    saved.expert_rows_held = static_cast<std::size_t>(held.expert_rows);
  }
  reserve_expert_rows(expert_rows);
  MoeExpertScratch<Activation>& es = expert_scratch_;

  if (expert_parallel_) {
    b.moe_permute(x, h, saved.row_tokens, rows, s.sent);
    exchange(saved, s.sent, es.exchanged, false)->wait();
    regroup(saved, es.exchanged, saved.expert.rows, true);
  } else {
    b.moe_permute(x, h, saved.row_tokens, rows, saved.expert.rows);
  }
  for_each_expert(saved, [&](std::size_t expert, std::size_t first, std::size_t n) {
    b.linear_forward(b.offset(saved.expert.rows, first * h), weights.fc1[expert], nullptr, n, h, 2 * f,
                     GemmEpilogue::kNone, b.offset(saved.expert.fc1_out, first * 2 * f), nullptr);
  });
  b.swiglu_forward(saved.expert.fc1_out, expert_rows, f, es.activated);
  const Activation expert_out = expert_parallel_ ? es.d_rows : saved.expert_out;
  for_each_expert(saved, [&](std::size_t expert, std::size_t first, std::size_t n) {
    b.linear_forward(b.offset(es.activated, first * f), weights.fc2[expert], nullptr, n, f, h, GemmEpilogue::kNone,
                     b.offset(expert_out, first * h), nullptr);
  });
  if (expert_parallel_) {
    regroup(saved, expert_out, es.exchanged, false);
    exchange(saved, es.exchanged, saved.expert_out, true)->wait();
  }
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
  expert_load_by_layer_[layer] +=
      expert_parallel_ ? saved.group_load : max_over_mean({saved.rows_per_expert.begin(), saved.rows_per_expert.end()});
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
  MoeExpertScratch<Activation>& es = expert_scratch_;
  const std::size_t t = shape_.tokens, h = shape_.hidden, f = shape_.ffn, k = shape_.router.topk;
  const std::size_t e = shape_.router.experts;
  const std::size_t rows = dispatched_rows(saved);
  std::size_t expert_rows = 0;
  for (const int64_t n : local_rows(saved)) expert_rows += static_cast<std::size_t>(n);
  b.moe_combine_backward(dy, saved.expert_out, h, {saved.token_rows, saved.row_tokens}, saved.probs, t, k, rows,
                         s.d_expert_out, s.d_probs);
  // The experts' outputs' gradient where the experts computed them.
  Activation d_expert_out = s.d_expert_out;
  if (expert_parallel_) {
    exchange(saved, s.d_expert_out, es.exchanged, false)->wait();
    regroup(saved, es.exchanged, es.d_rows, true);
    d_expert_out = es.d_rows;
  }
  b.swiglu_forward(saved.expert.fc1_out, expert_rows, f, es.activated);  // fc2's input again, as the dense MLP's
  for_each_expert(saved, [&](std::size_t expert, std::size_t first, std::size_t n) {
    b.linear_backward(b.offset(d_expert_out, first * h), b.offset(es.activated, first * f), weights.fc2[expert], n, f,
                      h, b.offset(es.d_activated, first * f), gradients.fc2[expert], nullptr);
  });
  b.swiglu_backward(es.d_activated, saved.expert.fc1_out, expert_rows, f, es.d_fc1_out);
  const Activation d_expert_rows = expert_parallel_ ? es.exchanged : es.d_rows;
  for_each_expert(saved, [&](std::size_t expert, std::size_t first, std::size_t n) {
    b.linear_backward(b.offset(es.d_fc1_out, first * 2 * f), b.offset(saved.expert.rows, first * h),
                      weights.fc1[expert], n, h, 2 * f, b.offset(d_expert_rows, first * h), gradients.fc1[expert],
                      nullptr);
  });
  // The rows' gradient back in the dispatch's order.
  ConstActivation d_rows = es.d_rows;
  if (expert_parallel_) {
    regroup(saved, es.exchanged, es.d_rows, false);
    exchange(saved, es.d_rows, s.sent, true)->wait();
    d_rows = s.sent;
  }
  b.moe_permute_backward(d_rows, h, saved.token_rows, t, k, dx);
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
    b.linear_backward(d_shared, s.shared_activated, weights.shared_fc2, t, w, h, es.d_activated, gradients.shared_fc2,
                      nullptr);
    b.swiglu_backward(es.d_activated, saved.shared_fc1_out, t, w, es.d_fc1_out);
    b.linear_backward(es.d_fc1_out, x, weights.shared_fc1, t, h, 2 * w, s.dx_part, gradients.shared_fc1, nullptr);
    b.add(dx, s.dx_part, t * h, dx);
  }
}

}  // namespace megaplan::exec
