// Megatron-Core's mixture-of-experts routing on the CPU, the reference the MoE layer's kernels are
// held to (issue 40): the top-k router (softmax before or after the choice, or sigmoid with the
// aux-loss-free expert bias), its load-balancing (switch) and z losses, the expert capacity and
// Megatron's two drop policies, the tokens permuted expert by expert and combined back by their
// probabilities, and the expert bias's update. fp32 in and out, double inside. Every backward adds
// to its gradients, as the layer's backward accumulates them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "executor/kernels/moe_routing.h"

namespace megaplan::exec::reference {

enum class RouterScore : uint8_t { kSoftmax, kSigmoid };

struct RouterOptions {
  std::size_t experts = 0;
  std::size_t topk = 0;
  RouterScore score = RouterScore::kSoftmax;
  // Softmax over every expert, then the top k (--moe-router-pre-softmax); else the top k logits,
  // then softmax over those k.
  bool pre_softmax = false;
  double scaling_factor = 1.0;  // --moe-router-topk-scaling-factor, applied to the probabilities
  // Sigmoid only (--moe-router-enable-expert-bias): [experts] added to the scores to choose the
  // experts, not to the probabilities. nullptr: none.
  const float* expert_bias = nullptr;
};

// Each token's k experts, by descending choosing score (ties to the lower expert), and their
// probabilities: [tokens x topk] each.
struct TopK {
  std::vector<int32_t> experts;
  std::vector<float> probs;
};

// REQUIRES: 1 <= options.topk <= options.experts.
TopK route_top_k(const float* logits, std::size_t tokens, const RouterOptions& options);
// Adds to d_logits [tokens x experts] the gradient of the probabilities' d_probs [tokens x topk].
void route_top_k_backward(const float* logits, const TopK& routed, const float* d_probs, std::size_t tokens,
                          const RouterOptions& options, float* d_logits);

// How many of these tokens the aux loss's top k sends to each expert (that top k is over the
// scores without the expert bias: softmax over every expert, or the sigmoids normalised to sum 1).
std::vector<int64_t> aux_loss_tokens_per_expert(const float* logits, std::size_t tokens, const RouterOptions& options);
// The switch load-balancing loss's share of these tokens, E·coeff/(k·T²) · Σ_i P_i·f_i with P_i the
// sum of these tokens' aux-loss scores for expert i and f_i `tokens_per_expert` (the counts of the
// whole group sharing the loss, T its tokens); adds its gradient to d_logits.
double switch_aux_loss(const float* logits, std::size_t tokens, const RouterOptions& options,
                       const std::vector<int64_t>& tokens_per_expert, std::size_t total_tokens, double coeff,
                       float* d_logits);
// DeepSeek-V2/V3's sequence-level loss (--moe-router-load-balancing-type seq_aux_loss): the tokens
// are `sequences` sequences of tokens / sequences consecutive rows each, and the loss is the mean
// over them of each one's switch loss with its own counts and length; adds its gradient. The
// counts of the group sharing a sequence are those of its rows here: Megatron all-reduces them
// over tp x cp, which holds the whole sequence.
double sequence_aux_loss(const float* logits, std::size_t tokens, std::size_t sequences, const RouterOptions& options,
                         double coeff, float* d_logits);
// ST-MoE's z loss over these tokens, coeff · mean (logsumexp of a token's logits)²; adds its gradient.
double z_loss(const float* logits, std::size_t tokens, std::size_t experts, double coeff, float* d_logits);

// --moe-token-drop-policy: an expert over its capacity keeps its highest-probability routes (ties
// to the earlier token), or its earliest tokens. The capacity is core/moe_spec.h's moe_expert_capacity.
using DropPolicy = MoeDropPolicy;

// One row an expert computes: a token's route (`slot` its place in the token's top k), or, padding
// the expert to its capacity, a token it was not routed to (slot -1), whose output counts for
// nothing.
struct Route {
  int64_t token = 0;
  int32_t slot = -1;
};

// The rows each expert computes, in token order (Megatron's permutation): dropless (capacity 0:
// every route), or at most `capacity` routes an expert, dropped by `policy`; with `pad`, every
// expert filled to exactly `capacity` rows by the earliest tokens not routed to it.
struct Dispatch {
  std::vector<std::vector<Route>> by_expert;
  std::size_t rows() const;
};
Dispatch dispatch_routes(const TopK& routed, std::size_t tokens, std::size_t experts, std::size_t topk,
                         std::size_t capacity, DropPolicy policy, bool pad);

// x [tokens x hidden] into the experts' rows [dispatch.rows() x hidden], expert by expert.
void permute_tokens(const float* x, std::size_t hidden, const Dispatch& dispatch, float* rows);
// Adds each row's gradient back to its token: dx [tokens x hidden].
void permute_tokens_backward(const float* d_rows, std::size_t hidden, const Dispatch& dispatch, float* dx);
// y [tokens x hidden] (overwritten) = Σ over a token's kept routes of prob · the expert's row.
void combine_tokens(const float* rows, std::size_t hidden, const Dispatch& dispatch, const TopK& routed,
                    std::size_t tokens, std::size_t topk, float* y);
// From dy: each row's gradient (overwritten, d_rows [rows x hidden]; a pad row's is 0) and each
// kept route's probability gradient, added to d_probs [tokens x topk].
void combine_tokens_backward(const float* dy, const float* rows, std::size_t hidden, const Dispatch& dispatch,
                             const TopK& routed, std::size_t topk, float* d_rows, float* d_probs);

// The aux-loss-free balancing step: each expert's bias moves by `rate` toward the mean load (up
// when it got fewer tokens than the mean, down when more).
void update_expert_bias(const std::vector<int64_t>& tokens_per_expert, double rate, float* expert_bias);

}  // namespace megaplan::exec::reference
