// Causal flash attention (FlashAttention-2's scheme) on Hopper's warpgroup MMA (sm_90a), its 16-bit
// inputs and outputs bf16 or fp16 as `precision` says: the forward streams key blocks through an
// online softmax and keeps only each row's log-sum-exp; the backward recomputes the probabilities,
// and the dropout mask on them, which is drawn, never stored.
// Deterministic: dK and dV are computed per key block and dQ per query block by two kernels, each
// output written by one thread block, no atomics.
#pragma once

#include <cuda_runtime_api.h>  // cudaStream_t

#include <cstddef>
#include <cstdint>

#include "core/implementation_options.h"
#include "executor/kernels/cuda/bf16_linear.h"
#include "executor/kernels/dropout_mask.h"

namespace megaplan::exec::cuda {

// Element d of query head h at token t of sequence b lives at
//   q[(b * seq + t) * qkv_token_stride + (h / group) * qkv_head_stride + (h % group) * head_dim + d]
// with group = heads / kv_heads query heads per key-value head, and key-value head g at
//   k[(b * seq + t) * qkv_token_stride + g * qkv_head_stride + d] (v alike).
// Megatron's fused qkv [b, s, groups, group + 2, d] is q = qkv, k = qkv + group * d,
// v = qkv + (group + 1) * d, qkv_head_stride = (group + 2) * d, qkv_token_stride = groups * that.
//
// Dropout on the probabilities (inactive by default): Z[b, h, i, j] = dropout.keeps_probability(b,
// h, i, j) with h this call's query head (dropout.first_head places it among the model's) and
// dropout.seq == seq.
struct AttentionShape {
  int64_t batch, seq, heads, kv_heads, head_dim;
  int64_t qkv_token_stride, qkv_head_stride;
  float softmax_scale;
  DropoutMask dropout = {};
};

// o = (P ∘ Z / (1 - p)) v with P = softmax(q k^T * softmax_scale, causal) into out [batch, seq,
// heads, head_dim] and the natural log-sum-exp of each row's scaled scores (before dropout) into
// lse [batch, heads, seq]. The backward is FlashAttention-2's with dropout: dV = (P ∘ Z / (1 - p))^T
// dO, dS = P ∘ (dO V^T ∘ Z / (1 - p) - rowsum(dO ∘ O)).
// head_dim must be 64 or 128 (SpecError otherwise). Both passes are asynchronous on `stream`.
void flash_attention_forward(const AttentionShape& shape, const Half* q, const Half* k, const Half* v, Half* out,
                             float* lse, DType precision, cudaStream_t stream);

std::size_t flash_attention_backward_workspace_bytes(const AttentionShape& shape);

// dq, dk, dv (overwritten) are laid out as q, k, v but with dqkv_token_stride per token.
void flash_attention_backward(const AttentionShape& shape, const Half* dout, const Half* q, const Half* k,
                              const Half* v, const Half* out, const float* lse, int64_t dqkv_token_stride, Half* dq,
                              Half* dk, Half* dv, void* workspace, DType precision, cudaStream_t stream);

}  // namespace megaplan::exec::cuda
