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
  if (moe.expert_parallel > 1) {
    const int64_t local = moe.local_experts();
    for (int64_t member = 0; member < moe.expert_parallel; ++member) {
      load.received.insert(load.received.end(), rows.begin(), rows.begin() + local);
    }
  }
  return load;
}

MoeKernels moe_kernels(const MoeDims& moe, const MoeLoad& load, int64_t activation_bytes) {
  const int64_t t = moe.tokens, h = moe.hidden, f = moe.ffn, e = moe.experts, k = moe.topk;
  const int64_t local = moe.local_experts();
  const bool exchanged = moe.expert_parallel > 1;
  const std::vector<int64_t> rows_per_expert = load.local_rows(local);
  const int64_t rows = load.dispatched_rows(), expert_rows = load.expert_rows(local);
  MoeKernels kernels;
  std::vector<Kernel>& fwd = kernels.forward;
  std::vector<Kernel>& bwd = kernels.backward;
  // Rows regrouped between the order they travel in (by sender) and the experts' order: one copy
  // per sender's run of rows for an expert.
  const auto regroup = [&](std::vector<Kernel>& list) {
    for (const int64_t n : load.received) {
      if (n > 0) list.push_back(flat_kernel(KernelKind::kCopy, n * h));
    }
  };
  // The experts' GEMMs, one per expert with rows: (rows, outputs, inputs) as the forward's shape.
  const auto per_expert = [&](std::vector<Kernel>& list, GemmLayout layout, int64_t n, int64_t in) {
    for (const int64_t expert_rows_of : rows_per_expert) {
      if (expert_rows_of == 0) continue;
      list.push_back(gemm_kernel(layout, GemmEpilogue::kNone, expert_rows_of, n, in));
      if (layout == GemmLayout::kInputGradient) {
        list.push_back(gemm_kernel(GemmLayout::kWeightGradient, GemmEpilogue::kNone, expert_rows_of, n, in));
      }
    }
  };
  const auto backward_gemm = [&](std::vector<Kernel>& list, int64_t m, int64_t n, int64_t in) {
    list.push_back(gemm_kernel(GemmLayout::kInputGradient, GemmEpilogue::kNone, m, n, in));
    list.push_back(gemm_kernel(GemmLayout::kWeightGradient, GemmEpilogue::kNone, m, n, in));
  };

  // Forward: the router, the top k, the dispatch; the rows out to their experts, the experts, the
  // rows back and combined; the shared expert; the aux loss's counts and the losses for the log.
  fwd.push_back(gemm_kernel(GemmLayout::kForward, GemmEpilogue::kNone, t, e, h));
  fwd.push_back(moe_kernel(KernelKind::kMoeTopK, t, e, k));
  fwd.push_back(moe_kernel(KernelKind::kMoeDispatch, t, e, k));
  fwd.push_back(row_kernel(KernelKind::kMoePermute, rows, h));
  if (exchanged) regroup(fwd);
  per_expert(fwd, GemmLayout::kForward, 2 * f, h);
  fwd.push_back(row_kernel(KernelKind::kSwigluForward, expert_rows, f));
  per_expert(fwd, GemmLayout::kForward, h, f);
  if (exchanged) regroup(fwd);
  fwd.push_back(moe_kernel(KernelKind::kMoeCombine, t, h, k));
  const int64_t w = moe.shared_ffn;
  if (w > 0) {
    fwd.push_back(gemm_kernel(GemmLayout::kForward, GemmEpilogue::kNone, t, 2 * w, h));
    fwd.push_back(row_kernel(KernelKind::kSwigluForward, t, w));
    fwd.push_back(gemm_kernel(GemmLayout::kForward, GemmEpilogue::kNone, t, h, w));
    if (moe.shared_gate) {
      fwd.push_back(gemm_kernel(GemmLayout::kForward, GemmEpilogue::kNone, t, 1, h));
      fwd.push_back(row_kernel(KernelKind::kSigmoidGatedAdd, t, h));
    } else {
      fwd.push_back(flat_kernel(KernelKind::kAdd, t * h));
    }
  }
  const bool sequence_loss = moe.aux_loss && moe.aux_loss_sequences > 0, switch_loss = moe.aux_loss && !sequence_loss;
  if (switch_loss) fwd.push_back(moe_kernel(KernelKind::kMoeAuxCounts, t, e, k));
  if (sequence_loss) fwd.push_back(moe_kernel(KernelKind::kMoeSequenceAuxLoss, t, e, k, moe.aux_loss_sequences));
  if (switch_loss) fwd.push_back(moe_kernel(KernelKind::kMoeSwitchLoss, t, e, k));
  if (moe.z_loss) fwd.push_back(row_kernel(KernelKind::kMoeZLoss, t, e));

  // Backward: combine's, the gradients out to the experts; SwiGLU's output again (fc2's input), the
  // experts' input and weight gradients; the rows' gradients home and summed per token; the router
  // through its top k and the losses; the shared expert.
  bwd.push_back(moe_kernel(KernelKind::kMoeCombineBackward, t, h, k, rows));
  if (exchanged) regroup(bwd);
  bwd.push_back(row_kernel(KernelKind::kSwigluForward, expert_rows, f));
  per_expert(bwd, GemmLayout::kInputGradient, h, f);
  bwd.push_back(row_kernel(KernelKind::kSwigluBackward, expert_rows, f));
  per_expert(bwd, GemmLayout::kInputGradient, 2 * f, h);
  if (exchanged) regroup(bwd);
  bwd.push_back(moe_kernel(KernelKind::kMoePermuteBackward, t, h, k));
  bwd.push_back(flat_kernel(KernelKind::kFill, t * e));
  bwd.push_back(moe_kernel(KernelKind::kMoeTopKBackward, t, e, k));
  if (sequence_loss)
    bwd.push_back(moe_kernel(KernelKind::kMoeSequenceAuxLossGradient, t, e, k, moe.aux_loss_sequences));
  if (switch_loss) bwd.push_back(moe_kernel(KernelKind::kMoeSwitchLossGradient, t, e, k));
  if (moe.z_loss) bwd.push_back(row_kernel(KernelKind::kMoeZLossGradient, t, e));
  bwd.push_back(flat_kernel(KernelKind::kConvert, t * e));
  backward_gemm(bwd, t, e, h);
  bwd.push_back(flat_kernel(KernelKind::kAdd, t * h));
  if (w > 0) {
    if (moe.shared_gate) {
      bwd.push_back(row_kernel(KernelKind::kSigmoidGatedAddBackward, t, h));
      bwd.push_back(flat_kernel(KernelKind::kConvert, t));
      backward_gemm(bwd, t, 1, h);
      bwd.push_back(flat_kernel(KernelKind::kAdd, t * h));
    }
    bwd.push_back(row_kernel(KernelKind::kSwigluForward, t, w));
    backward_gemm(bwd, t, h, w);
    bwd.push_back(row_kernel(KernelKind::kSwigluBackward, t, w));
    backward_gemm(bwd, t, 2 * w, h);
    bwd.push_back(flat_kernel(KernelKind::kAdd, t * h));
  }
  if (exchanged) {
    kernels.exchange_bytes = activation_bytes * std::max(rows, expert_rows) * h;
    kernels.count_bytes = kFp32 * moe.expert_parallel * e;
  }
  return kernels;
}

}  // namespace megaplan
