#include "executor/model/moe_mlp.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "executor/model/recipe_buffers.h"

namespace megaplan::exec {

MoeDims MoeMlpShape::dims(int64_t expert_parallel, int64_t tensor_parallel, int64_t context_parallel,
                          int64_t expert_tensor_parallel) const {
  const auto i64 = [](std::size_t n) { return static_cast<int64_t>(n); };
  return moe_dims(i64(tokens), i64(hidden), i64(ffn), i64(shared_ffn), shared_gate, i64(router.experts),
                  i64(router.topk), i64(capacity.capacity), capacity.pad, expert_parallel, tensor_parallel,
                  context_parallel, expert_tensor_parallel);
}

namespace {
Comm* group_of(Comm* comm) { return comm && comm->size() > 1 ? comm : nullptr; }
int64_t size_of(const Comm* comm) { return comm ? comm->size() : 1; }
}  // namespace

MoeMlp::MoeMlp(const MoeMlpShape& shape, Backend& backend, Comm* expert_parallel, Comm* tensor_parallel,
               Comm* context_parallel, std::optional<Comm*> expert_tensor_parallel)
    : shape_(shape),
      backend_(backend),
      expert_parallel_(group_of(expert_parallel)),
      tensor_parallel_(group_of(tensor_parallel)),
      context_parallel_(group_of(context_parallel)),
      expert_tensor_parallel_(group_of(expert_tensor_parallel.value_or(tensor_parallel))),
      dims_(shape.dims(size_of(expert_parallel_), size_of(tensor_parallel_), size_of(context_parallel_),
                       size_of(expert_tensor_parallel_))) {
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
  if (!expert_parallel_) {  // a dispatch's rows at most (each tp member's): the forward's are known at ep 1
    allocate_buffers(backend_, moe_expert_kept(dims_), saved.expert);
    saved.expert_rows_held = static_cast<std::size_t>(dims_.expert_rows());
  }
  return saved;
}

void MoeMlp::release(MoeMlpSaved& saved) {
  release_buffers(backend_, saved);
  release_buffers(backend_, saved.expert);
  saved.expert_rows_held = 0;
  saved.rows_per_expert.clear();
  saved.received.clear();
  saved.group_rows.clear();
  saved.room = 0;
}

MoeMlpDeferred MoeMlp::allocate_deferred(const MoeMlpSaved& saved) {
  MoeDims held = dims_;
  held.arrived_rows = static_cast<int64_t>(saved.expert_rows_held) / dims_.expert_tensor_parallel;
  MoeMlpDeferred deferred;
  allocate_buffers(backend_, moe_deferred(held), deferred);
  return deferred;
}

void MoeMlp::release(MoeMlpDeferred& deferred) { release_buffers(backend_, deferred); }

RouterLosses MoeMlp::take_losses() {
  constexpr std::size_t n = 2 * kLossSumFloats;
  const auto members = static_cast<std::size_t>(size_of(tensor_parallel_));
  // Under tensor parallelism each member holds its share of the losses: gathered behind the sums.
  // (A cp member's share is summed with the others' by the trainer, over the data-parallel group
  // that context parallelism widens, as the LM loss's is.)
  std::vector<float> words(members * n);
  if (tensor_parallel_) {
    tensor_parallel_->all_gather(scratch_.loss_memory, scratch_.loss_memory + n, n, DType::kFloat32)->wait();
    backend_.download(words.data(), scratch_.loss_memory + n, members * n);
  } else {
    backend_.download(words.data(), scratch_.loss_memory, n);
  }
  RouterLosses losses;
  for (std::size_t member = 0; member < members; ++member) {
    double balancing = 0, z = 0;
    std::memcpy(&balancing, words.data() + member * n, sizeof(double));
    std::memcpy(&z, words.data() + member * n + kLossSumFloats, sizeof(double));
    losses.balancing += balancing;
    losses.z += z;
  }
  backend_.fill(scratch_.loss_memory, n, 0.0f);
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
  if (saved.received.empty()) return saved.rows_per_expert;
  const auto local = static_cast<std::size_t>(dims_.local_experts());
  std::vector<int64_t> rows(local, 0);
  for (std::size_t i = 0; i < saved.received.size(); ++i) rows[i % local] += saved.received[i];
  return rows;
}

std::size_t MoeMlp::expert_rows(const MoeMlpSaved& saved) const {
  std::size_t rows = 0;
  for (const int64_t n : local_rows(saved)) rows += static_cast<std::size_t>(n);
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

double MoeMlp::logged_load(const MoeMlpSaved& saved) {
  // Without expert parallelism the microbatch's rows: the counts gathered over the etp group where
  // it is the tp group, else the rank's own summed over the tp group; then over the cp group.
  const bool over_tensor = expert_tensor_parallel_ == tensor_parallel_;
  std::vector<double> rows = expert_parallel_ || over_tensor ? saved.group_rows : std::vector<double>{};
  if (rows.empty()) rows.assign(saved.rows_per_expert.begin(), saved.rows_per_expert.end());
  Comm* const tensor = over_tensor ? nullptr : tensor_parallel_;
  if (!expert_parallel_ && (tensor || context_parallel_)) {
    // Counts travel as fp32 (exact below 2^24 rows, as gather_counts checks).
    std::vector<float> counts(rows.begin(), rows.end());
    backend_.upload(scratch_.counts, counts.data(), counts.size());
    for (Comm* group : {tensor, context_parallel_}) {
      if (group) group->all_reduce(scratch_.counts, counts.size(), DType::kFloat32, ReduceOp::kSum)->wait();
    }
    backend_.download(counts.data(), scratch_.counts, counts.size());
    rows.assign(counts.begin(), counts.end());
  }
  // Each cp member's share: the trainer sums them over the data-parallel group, which cp widens.
  return max_over_mean(rows) / static_cast<double>(size_of(context_parallel_));
}

std::size_t MoeMlp::gather_counts(MoeMlpSaved& saved) {
  const auto experts = static_cast<std::size_t>(dims_.experts), local = static_cast<std::size_t>(dims_.local_experts());
  const auto ep = static_cast<std::size_t>(size_of(expert_parallel_)),
             tp = static_cast<std::size_t>(size_of(expert_tensor_parallel_));
  const auto ep_rank = static_cast<std::size_t>(expert_parallel_ ? expert_parallel_->rank() : 0);
  const auto tp_rank = static_cast<std::size_t>(expert_tensor_parallel_ ? expert_tensor_parallel_->rank() : 0);
  // Counts travel as fp32, exact below 2^24 rows: a dispatch makes at most tokens x topk.
  std::vector<float> counts(tp * ep * experts);
  for (std::size_t e = 0; e < experts; ++e) {
    if (saved.rows_per_expert[e] >= (int64_t{1} << 24)) {
      throw std::logic_error("MoeMlp: an expert's rows exceed 2^24 in one dispatch");
    }
    counts[e] = static_cast<float>(saved.rows_per_expert[e]);
  }
  // [tp x ep x experts]: the rank's own at (tp rank, ep rank), its ep group's beside it, then the tp group's.
  float* tp_slot = scratch_.counts + tp_rank * ep * experts;
  float* mine = tp_slot + ep_rank * experts;
  backend_.upload(mine, counts.data(), experts);
  if (expert_parallel_) expert_parallel_->all_gather(mine, tp_slot, experts, DType::kFloat32)->wait();
  if (expert_tensor_parallel_)
    expert_tensor_parallel_->all_gather(tp_slot, scratch_.counts, ep * experts, DType::kFloat32)->wait();
  backend_.download(counts.data(), scratch_.counts, counts.size());
  saved.group_rows.assign(experts, 0.0);  // every member's rows of each expert
  for (std::size_t i = 0; i < counts.size(); ++i) saved.group_rows[i % experts] += counts[i];
  // Each sender's rows for this rank's experts: ep rank `ep_rank`'s, within each tp member's ep group.
  saved.received.assign(tp * ep * local, 0);
  saved.room = 0;
  std::size_t rows = 0;
  for (std::size_t q = 0; q < tp; ++q) {
    std::size_t room = 0;
    for (std::size_t p = 0; p < ep; ++p) {
      for (std::size_t j = 0; j < local; ++j) {
        const auto n = static_cast<int64_t>(counts[(q * ep + p) * experts + ep_rank * local + j]);
        saved.received[(q * ep + p) * local + j] = n;
        room += static_cast<std::size_t>(n);
      }
    }
    saved.room = std::max(saved.room, room);
    rows += room;
  }
  return rows;
}

Request MoeMlp::exchange(const MoeMlpSaved& saved, ConstActivation input, Activation output, bool returning) {
  Comm& ep = *expert_parallel_;
  const auto local = static_cast<std::size_t>(dims_.local_experts()), h = shape_.hidden;
  const auto members = static_cast<std::size_t>(ep.size());
  const std::size_t own =
      static_cast<std::size_t>(expert_tensor_parallel_ ? expert_tensor_parallel_->rank() : 0) * members * local;
  // Elements to each member from the dispatch (its experts' rows), and from each member to the experts.
  std::vector<std::size_t> dispatched(members, 0), arrived(members, 0);
  for (std::size_t p = 0; p < members; ++p) {
    for (std::size_t j = 0; j < local; ++j) {
      dispatched[p] += static_cast<std::size_t>(saved.rows_per_expert[p * local + j]) * h;
      arrived[p] += static_cast<std::size_t>(saved.received[own + p * local + j]) * h;
    }
  }
  return returning ? ep.all_to_all(input, arrived, output, dispatched, backend_.activation_type())
                   : ep.all_to_all(input, dispatched, output, arrived, backend_.activation_type());
}

void MoeMlp::regroup(const MoeMlpSaved& saved, Activation from, Activation to, bool by_expert) {
  const auto local = static_cast<std::size_t>(dims_.local_experts()), h = shape_.hidden;
  const std::size_t senders = saved.received.size() / local;
  const std::size_t per_room =
      senders / static_cast<std::size_t>(size_of(expert_tensor_parallel_));  // ep members a room
  // Each (sender, expert) run's first row in both orders: by sender, each tp member's runs in its room.
  std::vector<std::size_t> by_sender(saved.received.size()), by_expert_first(saved.received.size());
  std::size_t row = 0;
  for (std::size_t i = 0; i < saved.received.size(); ++i) {
    if (i % (per_room * local) == 0) row = (i / (per_room * local)) * saved.room;
    by_sender[i] = row;
    row += static_cast<std::size_t>(saved.received[i]);
  }
  row = 0;
  for (std::size_t j = 0; j < local; ++j) {
    for (std::size_t q = 0; q < senders; ++q) {
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

Activation MoeMlp::own_room(const MoeMlpSaved& saved) {
  if (!expert_tensor_parallel_) return expert_scratch_.exchanged;
  return backend_.offset(expert_scratch_.gathered,
                         static_cast<std::size_t>(expert_tensor_parallel_->rank()) * saved.room * shape_.hidden);
}

void MoeMlp::reserve_arrived_rows(std::size_t rows) {
  if (static_cast<int64_t>(rows) <= dims_.arrived_rows) return;
  release_buffers(backend_, expert_scratch_);
  dims_.arrived_rows = moe_expert_rows(static_cast<int64_t>(rows), dims_.most_rows);
  allocate_buffers(backend_, moe_expert_scratch(dims_), expert_scratch_);
}

void MoeMlp::forward(ConstActivation x, ConstActivation x_gathered, const MoeMlpWeights& weights,
                     const float* expert_bias, MoeMlpSaved& saved, Activation y, bool add_losses, int64_t layer) {
  Backend& b = backend_;
  MoeScratch<Activation, float*>& s = scratch_;
  const std::size_t t = shape_.tokens, h = shape_.hidden, f = shape_.ffn, k = shape_.router.topk;
  const std::size_t e = shape_.router.experts, tp = static_cast<std::size_t>(size_of(tensor_parallel_)),
                    cp = static_cast<std::size_t>(size_of(context_parallel_));
  b.linear_forward(x, weights.router, nullptr, t, h, e, GemmEpilogue::kNone, saved.logits, nullptr);
  b.moe_top_k(saved.logits, t, shape_.router, expert_bias, saved.experts, saved.probs);
  saved.rows_per_expert = b.moe_dispatch(saved.experts, saved.probs, t, shape_.router, shape_.capacity,
                                         {saved.token_rows, saved.row_tokens});
  const std::size_t rows = dispatched_rows(saved);
  // The rows this rank's experts compute (every tp member's arrived rows), and buffers holding them.
  const bool moved = expert_parallel_ || expert_tensor_parallel_;
  const std::size_t expert_rows = moved ? gather_counts(saved) : rows;
  const std::size_t room = moved ? saved.room : rows;
  if (saved.expert_rows_held < expert_rows) {
    release_buffers(b, saved.expert);
    MoeDims held = dims_;
    held.arrived_rows = moe_expert_rows(static_cast<int64_t>(room), dims_.most_rows);
    allocate_buffers(b, moe_expert_kept(held), saved.expert);
    saved.expert_rows_held = static_cast<std::size_t>(held.expert_rows());
  }
  reserve_arrived_rows(room);
  MoeExpertScratch<Activation>& es = expert_scratch_;

  // The rank's rows to its experts' ranks (ep) and every tp member's gathered, grouped by expert.
  const Activation arrived = own_room(saved);
  if (expert_parallel_) {
    b.moe_permute(x, h, saved.row_tokens, rows, s.sent);
    exchange(saved, s.sent, arrived, false)->wait();
  } else {
    b.moe_permute(x, h, saved.row_tokens, rows, moved ? arrived : saved.expert.rows);
  }
  if (expert_tensor_parallel_)
    expert_tensor_parallel_->all_gather(arrived, es.gathered, room * h, b.activation_type())->wait();
  if (moved) regroup(saved, expert_tensor_parallel_ ? es.gathered : es.exchanged, saved.expert.rows, true);
  for_each_expert(saved, [&](std::size_t expert, std::size_t first, std::size_t n) {
    b.linear_forward(b.offset(saved.expert.rows, first * h), weights.fc1[expert], nullptr, n, h, 2 * f,
                     GemmEpilogue::kNone, b.offset(saved.expert.fc1_out, first * 2 * f), nullptr);
  });
  b.swiglu_forward(saved.expert.fc1_out, expert_rows, f, es.activated);
  const Activation expert_out = moved ? es.d_rows : saved.expert_out;
  for_each_expert(saved, [&](std::size_t expert, std::size_t first, std::size_t n) {
    b.linear_forward(b.offset(es.activated, first * f), weights.fc2[expert], nullptr, n, f, h, GemmEpilogue::kNone,
                     b.offset(expert_out, first * h), nullptr);
  });
  // The outputs home: each tp member's rows summed over the group, then back over the ep group.
  if (expert_tensor_parallel_) {
    regroup(saved, expert_out, es.gathered, false);
    expert_tensor_parallel_
        ->reduce_scatter(es.gathered, expert_parallel_ ? es.exchanged : saved.expert_out, room * h, b.activation_type(),
                         ReduceOp::kSum)
        ->wait();
  } else if (expert_parallel_) {
    regroup(saved, expert_out, es.exchanged, false);
  }
  if (expert_parallel_) exchange(saved, es.exchanged, saved.expert_out, true)->wait();
  b.moe_combine(saved.expert_out, h, saved.token_rows, saved.probs, t, k, y);
  if (shape_.shared_ffn > 0) {
    const std::size_t w = shape_.shared_ffn, shared = t * tp;
    b.linear_forward(x_gathered, weights.shared_fc1, nullptr, shared, h, 2 * w, GemmEpilogue::kNone,
                     saved.shared_fc1_out, nullptr);
    b.swiglu_forward(saved.shared_fc1_out, shared, w, s.shared_activated);
    const Activation shared_out = dims_.shared_gate && !tensor_parallel_ ? saved.shared_out : s.shared_out;
    b.linear_forward(s.shared_activated, weights.shared_fc2, nullptr, shared, w, h, GemmEpilogue::kNone, shared_out,
                     nullptr);
    // The rank's rows of it (under tensor parallelism the group's partial sums, reduce-scattered).
    Activation shared_rows = shared_out;
    if (tensor_parallel_) {
      shared_rows = dims_.shared_gate ? saved.shared_out : s.shared_rows;
      tensor_parallel_->reduce_scatter(shared_out, shared_rows, t * h, b.activation_type(), ReduceOp::kSum)->wait();
    }
    if (dims_.shared_gate) {
      b.linear_forward(x, weights.shared_gate, nullptr, t, h, 1, GemmEpilogue::kNone, saved.gate_logits, nullptr);
      b.sigmoid_gated_add(shared_rows, saved.gate_logits, t, h, y);
    } else {
      b.add(y, shared_rows, t * h, y);
    }
  }
  if (shape_.aux_loss_coeff > 0 && shape_.aux_loss_sequences == 0) {
    b.moe_aux_loss_counts(saved.logits, t, shape_.router, saved.aux_counts);
    // The switch loss balances the tp and cp groups' tokens: their counts, summed.
    if (tensor_parallel_) tensor_parallel_->all_reduce(saved.aux_counts, e, DType::kFloat32, ReduceOp::kSum)->wait();
    if (context_parallel_) context_parallel_->all_reduce(saved.aux_counts, e, DType::kFloat32, ReduceOp::kSum)->wait();
  }
  if (!add_losses) return;
  expert_load_by_layer_[layer] += logged_load(saved);
  // The values alone, at a coefficient of 1: Megatron logs each loss over its coefficient. Under
  // tensor parallelism each member adds its share (take_losses sums them).
  if (shape_.aux_loss_coeff > 0 && shape_.aux_loss_sequences > 0) {
    b.moe_sequence_aux_loss(saved.logits, t, shape_.aux_loss_sequences, shape_.router, 1.0 / static_cast<double>(tp),
                            balancing_sum_, nullptr, 0);
  } else if (shape_.aux_loss_coeff > 0) {
    b.moe_switch_loss(saved.logits, t, shape_.router, saved.aux_counts, t * tp * cp, 1.0, balancing_sum_, nullptr, 0);
  }
  if (shape_.z_loss_coeff > 0) {
    b.moe_z_loss(saved.logits, t, e, 1.0 / static_cast<double>(tp * cp), z_sum_, nullptr, 0);
  }
}

void MoeMlp::router_loss_gradients(const MoeMlpSaved& saved, float* d_logits, float scale) {
  const std::size_t t = shape_.tokens, tp = static_cast<std::size_t>(size_of(tensor_parallel_)),
                    cp = static_cast<std::size_t>(size_of(context_parallel_));
  // The sequence loss is the mean over the tp group's sequences: each rank's mean over its own, over tp.
  if (shape_.aux_loss_coeff > 0 && shape_.aux_loss_sequences > 0) {
    backend_.moe_sequence_aux_loss(saved.logits, t, shape_.aux_loss_sequences, shape_.router,
                                   shape_.aux_loss_coeff / static_cast<double>(tp), nullptr, d_logits, scale);
  } else if (shape_.aux_loss_coeff > 0) {
    backend_.moe_switch_loss(saved.logits, t, shape_.router, saved.aux_counts, t * tp * cp, shape_.aux_loss_coeff,
                             nullptr, d_logits, scale);
  }
  // The z loss is the mean over the tp and cp groups' tokens: each member's mean over its own, over tp x cp.
  if (shape_.z_loss_coeff > 0) {
    backend_.moe_z_loss(saved.logits, t, shape_.router.experts, shape_.z_loss_coeff / static_cast<double>(tp * cp),
                        nullptr, d_logits, scale);
  }
}

void MoeMlp::backward(ConstActivation dy, ConstActivation x, ConstActivation x_gathered, const MoeMlpWeights& weights,
                      const MoeMlpSaved& saved, const MoeMlpGradients& gradients, float loss_gradient_scale,
                      Activation dx, MoeMlpDeferred* deferred) {
  Backend& b = backend_;
  MoeScratch<Activation, float*>& s = scratch_;
  MoeExpertScratch<Activation>& es = expert_scratch_;
  const std::size_t t = shape_.tokens, h = shape_.hidden, f = shape_.ffn, k = shape_.router.topk;
  const std::size_t e = shape_.router.experts, tp = static_cast<std::size_t>(size_of(tensor_parallel_));
  const std::size_t rows = dispatched_rows(saved);
  const std::size_t expert_rows = this->expert_rows(saved);
  const bool moved = expert_parallel_ || expert_tensor_parallel_;
  const std::size_t room = moved ? saved.room : rows;
  const Activation arrived = own_room(saved);
  // The experts' outputs' gradient where the experts computed them: in the dispatch's order, out
  // over the ep group, gathered over the tp group, grouped by expert.
  const Activation d_dispatched = expert_tensor_parallel_ && !expert_parallel_ ? arrived : s.d_expert_out;
  b.moe_combine_backward(dy, saved.expert_out, h, {saved.token_rows, saved.row_tokens}, saved.probs, t, k, rows,
                         d_dispatched, s.d_probs);
  if (expert_parallel_) exchange(saved, s.d_expert_out, arrived, false)->wait();
  if (expert_tensor_parallel_)
    expert_tensor_parallel_->all_gather(arrived, es.gathered, room * h, b.activation_type())->wait();
  Activation d_expert_out = s.d_expert_out;
  if (moved) {
    regroup(saved, expert_tensor_parallel_ ? es.gathered : es.exchanged, es.d_rows, true);
    d_expert_out = es.d_rows;
  }
  // Under I each weight GEMM's output gradient is kept for W instead (`keep`): the experts' once over
  // all their rows.
  const auto weight_gradient = [&](float* gradient) { return deferred ? nullptr : gradient; };
  const auto keep = [&](ConstActivation gradient, std::size_t n, Activation MoeMlpDeferred::*field) {
    if (deferred) b.copy(gradient, n, deferred->*field);
  };
  if (!deferred) b.swiglu_forward(saved.expert.fc1_out, expert_rows, f, es.activated);  // fc2's input again
  for_each_expert(saved, [&](std::size_t expert, std::size_t first, std::size_t n) {
    b.linear_backward(b.offset(d_expert_out, first * h), b.offset(es.activated, first * f), weights.fc2[expert], n, f,
                      h, b.offset(es.d_activated, first * f), weight_gradient(gradients.fc2[expert]), nullptr);
  });
  keep(d_expert_out, expert_rows * h, &MoeMlpDeferred::expert_fc2);
  b.swiglu_backward(es.d_activated, saved.expert.fc1_out, expert_rows, f, es.d_fc1_out);
  const Activation d_expert_rows = expert_tensor_parallel_ ? es.gathered : expert_parallel_ ? es.exchanged : es.d_rows;
  for_each_expert(saved, [&](std::size_t expert, std::size_t first, std::size_t n) {
    b.linear_backward(b.offset(es.d_fc1_out, first * 2 * f), b.offset(saved.expert.rows, first * h),
                      weights.fc1[expert], n, h, 2 * f, b.offset(d_expert_rows, first * h),
                      weight_gradient(gradients.fc1[expert]), nullptr);
  });
  keep(es.d_fc1_out, expert_rows * 2 * f, &MoeMlpDeferred::expert_fc1);
  // The rows' gradient back in the dispatch's order: each tp member's summed over the group, then
  // home over the ep group.
  ConstActivation d_rows = es.d_rows;
  if (expert_tensor_parallel_) {
    regroup(saved, es.gathered, es.d_rows, false);
    const Activation own = expert_parallel_ ? es.exchanged : s.d_expert_out;
    expert_tensor_parallel_->reduce_scatter(es.d_rows, own, room * h, b.activation_type(), ReduceOp::kSum)->wait();
    d_rows = own;
  } else if (expert_parallel_) {
    regroup(saved, es.exchanged, es.d_rows, false);
  }
  if (expert_parallel_) {
    exchange(saved, expert_tensor_parallel_ ? es.exchanged : es.d_rows, s.sent, true)->wait();
    d_rows = s.sent;
  }
  b.moe_permute_backward(d_rows, h, saved.token_rows, t, k, dx);
  // The router: the probabilities' gradient and the losses', through the router GEMM.
  b.fill(s.d_logits, t * e, 0.0f);
  b.moe_top_k_backward(saved.logits, t, shape_.router, saved.experts, s.d_probs, s.d_logits);
  router_loss_gradients(saved, s.d_logits, loss_gradient_scale);
  b.convert(s.d_logits, t * e, s.d_logits_compute);
  b.linear_backward(s.d_logits_compute, x, weights.router, t, h, e, s.dx_part, weight_gradient(gradients.router),
                    nullptr);
  keep(s.d_logits_compute, t * e, &MoeMlpDeferred::logits);
  b.add(dx, s.dx_part, t * h, dx);
  if (shape_.shared_ffn > 0) {
    const std::size_t w = shape_.shared_ffn, shared = t * tp;
    ConstActivation d_shared = dy;
    if (dims_.shared_gate) {  // through sigmoid(x·g): the gate's own gradient reaches g and x
      const Activation d_gated = tensor_parallel_ ? s.shared_rows : s.shared_out;
      b.sigmoid_gated_add_backward(dy, saved.shared_out, saved.gate_logits, t, h, d_gated, s.d_gate);
      b.convert(s.d_gate, t, s.d_gate_compute);
      b.linear_backward(s.d_gate_compute, x, weights.shared_gate, t, h, 1, s.dx_part,
                        weight_gradient(gradients.shared_gate), nullptr);
      keep(s.d_gate_compute, t, &MoeMlpDeferred::gate);
      b.add(dx, s.dx_part, t * h, dx);
      d_shared = d_gated;
    }
    if (tensor_parallel_) {  // the tp group's rows' gradient, gathered
      tensor_parallel_->all_gather(d_shared, s.shared_out, t * h, b.activation_type())->wait();
      d_shared = s.shared_out;
    }
    if (!deferred) b.swiglu_forward(saved.shared_fc1_out, shared, w, s.shared_activated);
    b.linear_backward(d_shared, s.shared_activated, weights.shared_fc2, shared, w, h, es.d_activated,
                      weight_gradient(gradients.shared_fc2), nullptr);
    keep(d_shared, shared * h, &MoeMlpDeferred::shared_fc2);
    b.swiglu_backward(es.d_activated, saved.shared_fc1_out, shared, w, es.d_fc1_out);
    b.linear_backward(es.d_fc1_out, x_gathered, weights.shared_fc1, shared, h, 2 * w, s.dx_part,
                      weight_gradient(gradients.shared_fc1), nullptr);
    keep(es.d_fc1_out, shared * 2 * w, &MoeMlpDeferred::shared_fc1);
    ConstActivation dx_shared = s.dx_part;
    if (tensor_parallel_) {  // partial sums over the group's rows: the rank's, summed
      tensor_parallel_->reduce_scatter(s.dx_part, s.shared_rows, t * h, b.activation_type(), ReduceOp::kSum)->wait();
      dx_shared = s.shared_rows;
    }
    b.add(dx, dx_shared, t * h, dx);
  }
}

void MoeMlp::weight_gradients(ConstActivation x, ConstActivation x_gathered, const MoeMlpSaved& saved,
                              const MoeMlpDeferred& deferred, const MoeMlpGradients& gradients) {
  Backend& b = backend_;
  MoeScratch<Activation, float*>& s = scratch_;
  MoeExpertScratch<Activation>& es = expert_scratch_;
  const std::size_t t = shape_.tokens, h = shape_.hidden, f = shape_.ffn, e = shape_.router.experts,
                    tp = static_cast<std::size_t>(size_of(tensor_parallel_));
  const std::size_t expert_rows = this->expert_rows(saved);
  b.swiglu_forward(saved.expert.fc1_out, expert_rows, f, es.activated);  // fc2's input again
  for_each_expert(saved, [&](std::size_t expert, std::size_t first, std::size_t n) {
    b.linear_backward(b.offset(deferred.expert_fc2, first * h), b.offset(es.activated, first * f), nullptr, n, f, h,
                      nullptr, gradients.fc2[expert], nullptr);
  });
  for_each_expert(saved, [&](std::size_t expert, std::size_t first, std::size_t n) {
    b.linear_backward(b.offset(deferred.expert_fc1, first * 2 * f), b.offset(saved.expert.rows, first * h), nullptr, n,
                      h, 2 * f, nullptr, gradients.fc1[expert], nullptr);
  });
  b.linear_backward(deferred.logits, x, nullptr, t, h, e, nullptr, gradients.router, nullptr);
  if (shape_.shared_ffn == 0) return;
  const std::size_t w = shape_.shared_ffn, shared = t * tp;
  if (dims_.shared_gate) b.linear_backward(deferred.gate, x, nullptr, t, h, 1, nullptr, gradients.shared_gate, nullptr);
  b.swiglu_forward(saved.shared_fc1_out, shared, w, s.shared_activated);
  b.linear_backward(deferred.shared_fc2, s.shared_activated, nullptr, shared, w, h, nullptr, gradients.shared_fc2,
                    nullptr);
  b.linear_backward(deferred.shared_fc1, x_gathered, nullptr, shared, h, 2 * w, nullptr, gradients.shared_fc1, nullptr);
}

}  // namespace megaplan::exec
