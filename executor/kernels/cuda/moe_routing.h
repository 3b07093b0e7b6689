// Mixture-of-experts routing on the GPU (Backend::moe_*, kernels/moe_routing.h; issue 40), held to
// the CPU reference kernels/reference/moe_router.h: Megatron-Core's top-k router (softmax before or
// after the choice, or sigmoid with the aux-loss-free expert bias) and its backward, the token
// dispatch (rows expert by expert, each expert's in token order; with a capacity, the routes each
// drop policy keeps, padded with the earliest tokens not routed to the expert), the permutation of
// the tokens into those rows and their combination back by the probabilities, the load-balancing
// (switch and sequence-level) and z losses, and the expert bias's update.
//
// Router logits and activations are 16-bit values (bf16 or fp16, as `precision` says);
// probabilities, counts and the logits' gradient fp32; indices int32. fp32 math inside. Every
// reduction runs in a fixed order and no floating-point sum uses atomics, so every run gives the
// same bits; integer counts use integer atomics, whose results do not depend on their order. All
// pointers are device pointers; every call is asynchronous on the stream it is given.
// REQUIRES (else SpecError("--device", ...)): 1 <= topk <= min(experts, 32), experts <= 1024.
#pragma once

#include <cuda_runtime_api.h>  // cudaStream_t

#include <cstddef>
#include <cstdint>

#include "core/implementation_options.h"
#include "executor/kernels/cuda/bf16_linear.h"
#include "executor/kernels/moe_routing.h"

namespace megaplan::exec::cuda {

// Bytes of device workspace any call below that takes one needs for these sizes (`sequences` the
// sequence-level loss's): moe_dispatch's sorting, the losses' per-token values and counts.
std::size_t moe_workspace_bytes(int64_t tokens, int64_t topk, int64_t experts, int64_t sequences = 1);

// Each token's top k experts of logits [tokens x experts], by descending choosing score (ties to the
// lower expert), into experts [tokens x topk], and their probabilities into probs [tokens x topk]:
// - softmax, pre_softmax: chosen by the logits (softmax is monotonic), probabilities the softmax
//   over every expert;
// - softmax: chosen by the logits, probabilities the softmax over the k chosen logits;
// - sigmoid: chosen by the logits without an expert bias, by sigmoid(z) + expert_bias[i] in fp32
//   with one ([experts] fp32, may be null); probabilities the chosen sigmoids, normalised to sum 1
//   (plus 1e-20, as Megatron) when k > 1.
// Then times the scaling factor. One warp per token.
void moe_top_k(const Half* logits, int64_t tokens, const MoeRouter& router, const float* expert_bias, int32_t* experts,
               float* probs, DType precision, cudaStream_t stream);
// d_logits [tokens x experts] += the gradient of the probabilities' d_probs [tokens x topk] through
// moe_top_k's probabilities (the choice `experts` made).
void moe_top_k_backward(const Half* logits, int64_t tokens, const MoeRouter& router, const int32_t* experts,
                        const float* d_probs, float* d_logits, DType precision, cudaStream_t stream);

// counts [experts] += how many of the `routes` experts go to each expert (those outside
// [0, expert_count) go nowhere). `workspace`: moe_workspace_bytes(0, 0, expert_count).
void moe_count_routes(const int32_t* experts, int64_t routes, int64_t expert_count, float* counts, void* workspace,
                      cudaStream_t stream);

// The dispatch of the routes experts [tokens x topk] (probs [tokens x topk], read by the probs
// drop policy alone) as kernels/moe_routing.h defines it, the CPU's reference::dispatch_routes row
// for row: writes maps.token_rows [tokens x topk] (-1 where dropped) and maps.row_tokens (the first
// Σ rows_per_expert of it), and rows_per_expert [experts] (int64, device). The routes are sorted by
// expert in a stable counting sort (per-chunk counts, one scan, then each chunk's routes placed in
// order: ranks from warp matches and per-block running counts, no floating-point atomics); with a
// capacity, one block per expert keeps its routes (the earliest, or the highest probabilities found
// by a radix select, ties to the earlier token) and pads them.
void moe_dispatch(const int32_t* experts, const float* probs, int64_t tokens, int64_t topk, int64_t expert_count,
                  const MoeCapacity& capacity, MoeDispatchMaps maps, int64_t* rows_per_expert, void* workspace,
                  cudaStream_t stream);

// out [rows x hidden] = x's row of row_tokens[r] (a copy of the 16-bit values).
void moe_permute(const Half* x, int64_t hidden, const int32_t* row_tokens, int64_t rows, Half* out,
                 cudaStream_t stream);
// dx [tokens x hidden] (overwritten) = the sum, slot by slot, of the rows token_rows [tokens x topk]
// gives each token (-1: dropped, nothing).
void moe_permute_backward(const Half* d_rows, int64_t hidden, const int32_t* token_rows, int64_t tokens, int64_t topk,
                          Half* dx, DType precision, cudaStream_t stream);
// y [tokens x hidden] (overwritten) = Σ, slot by slot, of probs · the token's kept rows.
void moe_combine(const Half* rows, int64_t hidden, const int32_t* token_rows, const float* probs, int64_t tokens,
                 int64_t topk, Half* y, DType precision, cudaStream_t stream);
// d_rows [rows_count x hidden] (overwritten) = prob · dy of the row's token, 0 for a pad row (one
// no route of its token names); d_probs [tokens x topk] (overwritten) = dy · the route's row (a
// warp's fixed-order sum), 0 where dropped.
void moe_combine_backward(const Half* dy, const Half* rows, int64_t hidden, ConstMoeDispatchMaps maps,
                          const float* probs, int64_t tokens, int64_t topk, int64_t rows_count, Half* d_rows,
                          float* d_probs, DType precision, cudaStream_t stream);

// counts [experts] (overwritten) = how many tokens the load-balancing loss's own top k sends to
// each expert: chosen by the logits (softmax over every expert, or the normalised sigmoids, both
// monotonic in them; never the expert bias).
void moe_aux_loss_counts(const Half* logits, int64_t tokens, const MoeRouter& router, float* counts, void* workspace,
                         DType precision, cudaStream_t stream);
// The switch loss of these tokens, E·coeff/(k·T²) · Σ_i P_i·counts_i (T = total_tokens; P_i the
// tokens' summed aux scores: the softmax over every expert, or the sigmoids normalised to sum 1):
// *loss_sum += it (double; unless null) and d_logits += gradient_scale · its gradient (unless
// null). The tokens' terms are summed in a fixed order in double.
void moe_switch_loss(const Half* logits, int64_t tokens, const MoeRouter& router, const float* counts,
                     int64_t total_tokens, double coeff, double* loss_sum, float* d_logits, float gradient_scale,
                     void* workspace, DType precision, cudaStream_t stream);
// The sequence-level loss: `sequences` runs of tokens / sequences rows, each one's switch loss with
// its own aux counts and length, coeff / sequences each; as moe_switch_loss.
void moe_sequence_aux_loss(const Half* logits, int64_t tokens, int64_t sequences, const MoeRouter& router, double coeff,
                           double* loss_sum, float* d_logits, float gradient_scale, void* workspace, DType precision,
                           cudaStream_t stream);
// ST-MoE's z loss, coeff · mean over the tokens of logsumexp(logits)²; as moe_switch_loss.
void moe_z_loss(const Half* logits, int64_t tokens, int64_t experts, double coeff, double* loss_sum, float* d_logits,
                float gradient_scale, void* workspace, DType precision, cudaStream_t stream);

// expert_bias[i] += rate · sign(mean(counts) - counts[i]), in double as the reference (one block).
void moe_update_expert_bias(const float* counts, int64_t experts, float rate, float* expert_bias, cudaStream_t stream);

}  // namespace megaplan::exec::cuda
