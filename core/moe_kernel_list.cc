// An MoE MLP's kernels at a load, as executor/model/moe_mlp.cc launches them.
#include "core/moe_kernel_list.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace megaplan {

int64_t MoeLoad::dispatched_rows() const { return std::accumulate(dispatched.begin(), dispatched.end(), int64_t{0}); }

std::vector<int64_t> MoeLoad::local_rows(int64_t local_experts) const {
  if (received.empty()) return dispatched;
  std::vector<int64_t> rows(static_cast<std::size_t>(local_experts), 0);
  for (std::size_t i = 0; i < received.size(); ++i) rows[i % rows.size()] += received[i];
  return rows;
}

int64_t MoeLoad::expert_rows(int64_t local_experts) const {
  const std::vector<int64_t> rows = local_rows(local_experts);
  return std::accumulate(rows.begin(), rows.end(), int64_t{0});
}

int64_t MoeLoad::room_rows(int64_t member) const {
  if (received.empty()) return dispatched_rows();
  const std::size_t room = received.size() / static_cast<std::size_t>(tensor_parallel);
  const auto first = received.begin() + static_cast<std::ptrdiff_t>(room * static_cast<std::size_t>(member));
  return std::accumulate(first, first + static_cast<std::ptrdiff_t>(room), int64_t{0});
}

int64_t MoeLoad::arrived_rows() const {
  int64_t most = 0;
  for (int64_t member = 0; member < tensor_parallel; ++member) most = std::max(most, room_rows(member));
  return most;
}

MoeLoad moe_stated_load(const MoeDims& moe, double imbalance) {
  const int64_t experts = moe.experts, routes = moe.tokens * moe.topk;
  std::vector<int64_t> rows(static_cast<std::size_t>(experts));
  // The busiest expert takes at most one route of each token.
  const int64_t busiest = std::min(
      moe.tokens,
      static_cast<int64_t>(std::llround(imbalance * static_cast<double>(routes) / static_cast<double>(experts))));
  rows[0] = experts == 1 ? routes : busiest;
  if (experts > 1) {
    const int64_t rest = routes - busiest, others = experts - 1;
    for (int64_t e = 1; e < experts; ++e)
      rows[static_cast<std::size_t>(e)] = rest / others + (e <= rest % others ? 1 : 0);
  }
  if (moe.capacity > 0) {
    for (int64_t& n : rows) n = moe.padded ? moe.capacity : std::min(n, moe.capacity);
  }
  MoeLoad load;
  load.dispatched = rows;
  load.tensor_parallel = moe.expert_tensor_parallel;
  if (moe.expert_parallel > 1 || moe.expert_tensor_parallel > 1) {
    const int64_t local = moe.local_experts();
    for (int64_t member = 0; member < moe.expert_parallel * moe.expert_tensor_parallel; ++member) {
      load.received.insert(load.received.end(), rows.begin(), rows.begin() + local);
    }
  }
  return load;
}

MoeKernels moe_kernels(const MoeDims& moe, const MoeLoad& load, int64_t activation_bytes) {
  const int64_t t = moe.tokens, h = moe.hidden, f = moe.ffn, e = moe.experts, k = moe.topk;
  const int64_t local = moe.local_experts();
  // `gathered`: the experts' rows over the etp group (`rows_group`: the tp group where etp = tp);
  // `tensor`: the shared expert's over the tp group, and the losses'.
  const bool exchanged = moe.expert_parallel > 1, gathered = moe.expert_tensor_parallel > 1;
  const bool tensor = moe.tensor_parallel > 1;
  const bool gathered_over_tensor = moe.expert_tensor_parallel == moe.tensor_parallel;
  const MoeGroup rows_group = gathered_over_tensor ? MoeGroup::kTensor : MoeGroup::kExpertTensor;
  const bool context = moe.context_parallel > 1;
  const std::vector<int64_t> rows_per_expert = load.local_rows(local);
  const int64_t rows = load.dispatched_rows(), expert_rows = load.expert_rows(local);
  MoeKernels kernels;
  std::vector<Kernel>& fwd = kernels.forward;
  // Rows regrouped between the order they travel in (by sender) and the experts' order: one copy
  // per sender's run of rows for an expert.
  const auto regroup = [&](std::vector<Kernel>& list) {
    if (!exchanged && !gathered) return;
    for (const int64_t n : load.received) {
      if (n > 0) list.push_back(flat_kernel(KernelKind::kCopy, n * h));
    }
  };
  // The experts' GEMMs, one per expert with rows: (rows, outputs, inputs) as the forward's shape.
  // The backward's with their weight gradients, or (`input_only`, under I) without.
  const auto per_expert = [&](std::vector<Kernel>& list, GemmLayout layout, int64_t n, int64_t in,
                              bool input_only = false) {
    for (const int64_t expert_rows_of : rows_per_expert) {
      if (expert_rows_of == 0) continue;
      if (input_only) {
        list.push_back(gemm_kernel(GemmLayout::kInputGradient, GemmEpilogue::kNone, expert_rows_of, n, in));
        continue;
      }
      list.push_back(gemm_kernel(layout, GemmEpilogue::kNone, expert_rows_of, n, in));
      if (layout == GemmLayout::kInputGradient) {
        list.push_back(gemm_kernel(GemmLayout::kWeightGradient, GemmEpilogue::kNone, expert_rows_of, n, in));
      }
    }
  };
  // The collectives around the experts, each pass: the rows out to the rank's ep group's experts
  // (an all-to-all of the larger of what it sends and what arrives for its own experts), gathered
  // over its tp group (every member's room of arrived rows) and the outputs reduce-scattered back,
  // then home by a second all-to-all.
  std::vector<MoeCollective> around_experts;
  const int64_t own_arrived = load.room_rows(0);  // the rank described is its tp group's first
  const int64_t exchange_bytes = activation_bytes * std::max(rows, own_arrived) * h;
  const int64_t room_bytes = activation_bytes * moe.expert_tensor_parallel * load.arrived_rows() * h;
  if (exchanged) around_experts.push_back({MoeGroup::kExpert, CollectiveOp::kAllToAll, exchange_bytes});
  if (gathered) {
    around_experts.push_back({rows_group, CollectiveOp::kAllGather, room_bytes});
    around_experts.push_back({rows_group, CollectiveOp::kReduceScatter, room_bytes});
  }
  if (exchanged) around_experts.push_back({MoeGroup::kExpert, CollectiveOp::kAllToAll, exchange_bytes});
  const int64_t shared_bytes = activation_bytes * moe.shared_tokens() * h;
  const int64_t w = moe.shared_ffn, shared = w > 0 ? moe.shared_tokens() : 0;

  // Forward: the shared expert's input gathered over the tp group; the router, the top k, the
  // dispatch; every rank's rows per expert gathered over the ep and tp groups; the rows out to their
  // experts, the experts, the rows back and combined; the shared expert (over the tp group's rows);
  // the aux loss's counts (summed over the tp group) and the losses for the log.
  std::vector<MoeCollective>& fwd_collectives = kernels.forward_collectives;
  // The shared expert's input, gathered over the tp group before the layer's MLP starts.
  if (tensor && w > 0) fwd_collectives.push_back({MoeGroup::kTensor, CollectiveOp::kAllGather, shared_bytes});
  fwd.push_back(gemm_kernel(GemmLayout::kForward, GemmEpilogue::kNone, t, e, h));
  fwd.push_back(moe_kernel(KernelKind::kMoeTopK, t, e, k));
  fwd.push_back(moe_kernel(KernelKind::kMoeDispatch, t, e, k));
  if (exchanged)
    fwd_collectives.push_back({MoeGroup::kExpert, CollectiveOp::kAllGather, kFp32 * moe.expert_parallel * e});
  if (gathered) {
    fwd_collectives.push_back(
        {rows_group, CollectiveOp::kAllGather, kFp32 * moe.expert_tensor_parallel * moe.expert_parallel * e});
  }
  fwd.push_back(row_kernel(KernelKind::kMoePermute, rows, h));
  regroup(fwd);
  per_expert(fwd, GemmLayout::kForward, 2 * f, h);
  fwd.push_back(row_kernel(KernelKind::kSwigluForward, expert_rows, f));
  per_expert(fwd, GemmLayout::kForward, h, f);
  regroup(fwd);
  fwd_collectives.insert(fwd_collectives.end(), around_experts.begin(), around_experts.end());
  fwd.push_back(moe_kernel(KernelKind::kMoeCombine, t, h, k));
  if (w > 0) {
    fwd.push_back(gemm_kernel(GemmLayout::kForward, GemmEpilogue::kNone, shared, 2 * w, h));
    fwd.push_back(row_kernel(KernelKind::kSwigluForward, shared, w));
    fwd.push_back(gemm_kernel(GemmLayout::kForward, GemmEpilogue::kNone, shared, h, w));
    if (tensor) fwd_collectives.push_back({MoeGroup::kTensor, CollectiveOp::kReduceScatter, shared_bytes});
    if (moe.shared_gate) {
      fwd.push_back(gemm_kernel(GemmLayout::kForward, GemmEpilogue::kNone, t, 1, h));
      fwd.push_back(row_kernel(KernelKind::kSigmoidGatedAdd, t, h));
    } else {
      fwd.push_back(flat_kernel(KernelKind::kAdd, t * h));
    }
  }
  const bool sequence_loss = moe.aux_loss && moe.aux_loss_sequences > 0, switch_loss = moe.aux_loss && !sequence_loss;
  if (switch_loss) {
    fwd.push_back(moe_kernel(KernelKind::kMoeAuxCounts, t, e, k));
    if (tensor) fwd_collectives.push_back({MoeGroup::kTensor, CollectiveOp::kAllReduce, kFp32 * e});
    if (context) fwd_collectives.push_back({MoeGroup::kContext, CollectiveOp::kAllReduce, kFp32 * e});
  }
  // Full recomputation's forward stops here: what follows only adds to the log (the losses; without
  // experts over ranks, the experts' rows summed over the tp group where the etp group is not it,
  // and over the cp group).
  kernels.forward_again = fwd;
  kernels.forward_again_collectives = fwd_collectives;
  if (tensor && !gathered_over_tensor && !exchanged) {
    fwd_collectives.push_back({MoeGroup::kTensor, CollectiveOp::kAllReduce, kFp32 * e});
  }
  if (context && !exchanged) fwd_collectives.push_back({MoeGroup::kContext, CollectiveOp::kAllReduce, kFp32 * e});
  if (sequence_loss) fwd.push_back(moe_kernel(KernelKind::kMoeSequenceAuxLoss, t, e, k, moe.aux_loss_sequences));
  if (switch_loss) fwd.push_back(moe_kernel(KernelKind::kMoeSwitchLoss, t, e, k));
  if (moe.z_loss) fwd.push_back(row_kernel(KernelKind::kMoeZLoss, t, e));

  // Backward: combine's, the gradients out to the experts; SwiGLU's output again (fc2's input), the
  // experts' input and weight gradients; the rows' gradients home and summed per token; the router
  // through its top k and the losses; the shared expert (its input gathered again first, its
  // output's gradient gathered, its input's reduce-scattered). Under I (`defer`) no SwiGLU again
  // and no weight gradients: each weight GEMM's output gradient is copied and kept for W, the
  // experts' once over all their rows.
  const auto backward = [&](bool defer) {
    std::vector<Kernel> list;
    const auto gemm = [&](int64_t m, int64_t n, int64_t in) {
      list.push_back(gemm_kernel(GemmLayout::kInputGradient, GemmEpilogue::kNone, m, n, in));
      list.push_back(defer ? flat_kernel(KernelKind::kCopy, m * n)
                           : gemm_kernel(GemmLayout::kWeightGradient, GemmEpilogue::kNone, m, n, in));
    };
    const auto experts = [&](int64_t n, int64_t in) {
      per_expert(list, GemmLayout::kInputGradient, n, in, defer);
      if (defer) list.push_back(flat_kernel(KernelKind::kCopy, expert_rows * n));
    };
    list.push_back(moe_kernel(KernelKind::kMoeCombineBackward, t, h, k, rows));
    regroup(list);
    if (!defer) list.push_back(row_kernel(KernelKind::kSwigluForward, expert_rows, f));
    experts(h, f);
    list.push_back(row_kernel(KernelKind::kSwigluBackward, expert_rows, f));
    experts(2 * f, h);
    regroup(list);
    list.push_back(moe_kernel(KernelKind::kMoePermuteBackward, t, h, k));
    list.push_back(flat_kernel(KernelKind::kFill, t * e));
    list.push_back(moe_kernel(KernelKind::kMoeTopKBackward, t, e, k));
    if (sequence_loss)
      list.push_back(moe_kernel(KernelKind::kMoeSequenceAuxLossGradient, t, e, k, moe.aux_loss_sequences));
    if (switch_loss) list.push_back(moe_kernel(KernelKind::kMoeSwitchLossGradient, t, e, k));
    if (moe.z_loss) list.push_back(row_kernel(KernelKind::kMoeZLossGradient, t, e));
    list.push_back(flat_kernel(KernelKind::kConvert, t * e));
    gemm(t, e, h);
    list.push_back(flat_kernel(KernelKind::kAdd, t * h));
    if (w > 0) {
      if (moe.shared_gate) {
        list.push_back(row_kernel(KernelKind::kSigmoidGatedAddBackward, t, h));
        list.push_back(flat_kernel(KernelKind::kConvert, t));
        gemm(t, 1, h);
        list.push_back(flat_kernel(KernelKind::kAdd, t * h));
      }
      if (!defer) list.push_back(row_kernel(KernelKind::kSwigluForward, shared, w));
      gemm(shared, h, w);
      list.push_back(row_kernel(KernelKind::kSwigluBackward, shared, w));
      gemm(shared, 2 * w, h);
      list.push_back(flat_kernel(KernelKind::kAdd, t * h));
    }
    return list;
  };
  kernels.backward = backward(false);
  kernels.backward_input = backward(true);
  std::vector<MoeCollective>& bwd_collectives = kernels.backward_collectives;
  if (tensor && w > 0) bwd_collectives.push_back({MoeGroup::kTensor, CollectiveOp::kAllGather, shared_bytes});
  bwd_collectives.insert(bwd_collectives.end(), around_experts.begin(), around_experts.end());
  if (tensor && w > 0) {
    bwd_collectives.push_back({MoeGroup::kTensor, CollectiveOp::kAllGather, shared_bytes});
    bwd_collectives.push_back({MoeGroup::kTensor, CollectiveOp::kReduceScatter, shared_bytes});
  }

  // W: SwiGLU's output again, the experts' weight gradients (fc2's, then fc1's), the router's, the
  // gate's and the shared expert's (its SwiGLU output again; its input gathered over the tp group
  // by the layer, before).
  std::vector<Kernel>& weight = kernels.weight;
  weight.push_back(row_kernel(KernelKind::kSwigluForward, expert_rows, f));
  for (const auto& [n, in] : {std::pair(h, f), std::pair(2 * f, h)}) {
    for (const int64_t n_rows : rows_per_expert) {
      if (n_rows > 0) weight.push_back(gemm_kernel(GemmLayout::kWeightGradient, GemmEpilogue::kNone, n_rows, n, in));
    }
  }
  weight.push_back(gemm_kernel(GemmLayout::kWeightGradient, GemmEpilogue::kNone, t, e, h));
  if (w > 0) {
    if (moe.shared_gate) weight.push_back(gemm_kernel(GemmLayout::kWeightGradient, GemmEpilogue::kNone, t, 1, h));
    weight.push_back(row_kernel(KernelKind::kSwigluForward, shared, w));
    weight.push_back(gemm_kernel(GemmLayout::kWeightGradient, GemmEpilogue::kNone, shared, h, w));
    weight.push_back(gemm_kernel(GemmLayout::kWeightGradient, GemmEpilogue::kNone, shared, 2 * w, h));
    if (tensor) kernels.weight_collectives.push_back({MoeGroup::kTensor, CollectiveOp::kAllGather, shared_bytes});
  }
  return kernels;
}

}  // namespace megaplan
