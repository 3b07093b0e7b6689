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

// Ring attention's block (context parallelism): `rows` queries of each sequence, from local row
// query_row0 of its shape.seq rows, against `rows` keys and values from local row key_row0 of a
// packed kv [batch, shape.seq, kv_heads, 2, head_dim] (each key-value head's key, then its value);
// query_first and key_first are the two chunks' first tokens' places in the whole sequence, whose
// length is shape.dropout.seq: the mask is drawn at the places, so that the blocks draw the whole
// sequence's. A block is diagonal (query_first == key_first, masked causally within) or wholly
// visible (key_first + rows <= query_first); std::logic_error for any other.
struct AttentionBlockShape {
  AttentionShape shape;  // seq: the local rows; the qkv strides: q's
  int64_t rows, query_row0, key_row0, query_first, key_first;
};

// Merges the block's attention into the query rows of the running out [batch, seq, heads,
// head_dim] and lse [batch, heads, seq] (fp32) by their log-sum-exp: out 0 and lse -inf before a
// row's first block; after its last, out is attention over every key its blocks showed it and lse
// its log-sum-exp.
void flash_attention_block_forward(const AttentionBlockShape& block, const Half* q, const Half* kv, float* out,
                                   float* lse, DType precision, cudaStream_t stream);

std::size_t flash_attention_block_backward_workspace_bytes(const AttentionBlockShape& block);

// The block's share of the gradient from dout and the merged forward's out (16-bit, [batch, seq,
// heads, head_dim]) and lse: dQ added to dq (laid out as q), dK and dV to dkv (laid out as kv).
// Deterministic as the whole sequence's backward.
void flash_attention_block_backward(const AttentionBlockShape& block, const Half* dout, const Half* q, const Half* kv,
                                    const Half* out, const float* lse, Half* dq, Half* dkv, void* workspace,
                                    DType precision, cudaStream_t stream);

// Between a fused qkv [batch, seq, groups, group + 2, dim] and a packed kv [batch, seq, groups, 2,
// dim]: kv = qkv's keys and values, or (unpack) qkv's keys and values = kv's, its queries unchanged.
void copy_key_values(const Half* from, Half* to, int64_t batch, int64_t seq, int64_t groups, int64_t group, int64_t dim,
                     bool unpack, cudaStream_t stream);

}  // namespace megaplan::exec::cuda
