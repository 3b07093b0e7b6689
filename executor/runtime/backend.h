// The operations a GPT needs, behind one interface so that the same model and runtime code runs on
// plain C++ fp32 (CpuBackend, for tests and tiny models) and on a GPU in bf16 or fp16 (the CUDA
// backend).
//
// Two kinds of buffer. fp32 buffers (float*) hold master weights, their gradients, optimizer
// state and per-row statistics. Activations (Activation) hold activations, their gradients and the
// compute copy of every weight in the backend's compute precision: fp32 on the CPU, bf16 or fp16
// on the GPU. The model passes activations between operations and never reads their elements.
// Token ids and loss masks are host arrays the backend reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/gemm.h"
#include "core/implementation_options.h"
#include "core/layer_recipe.h"
#include "executor/comm/comm.h"
#include "executor/kernels/dropout_mask.h"
#include "executor/kernels/moe_routing.h"
#include "executor/kernels/normal_draws.h"
#include "executor/kernels/rope_frequency.h"
#include "executor/kernels/token_places.h"

namespace megaplan::exec {

struct ActivationStorage;  // never defined: each backend reinterprets it as its compute type
using Activation = ActivationStorage*;
using ConstActivation = const ActivationStorage*;

// One parameter's buffers as the optimizer sees them.
struct OptimizerTensor {
  float* value;           // fp32 master weight
  const float* gradient;  // fp32
  float* first_moment;
  float* second_moment;
  Activation compute;  // refreshed from value after the step (may alias value)
  std::size_t size;
  double weight_decay;
};

// One of the marks a backend has handed out since its last release_marks() (Backend::mark).
struct TimingMark {
  std::size_t index;
};

struct AdamwSettings {
  int64_t step;  // 1-based, for the bias corrections
  double lr, beta1, beta2, eps;
  double gradient_scale;  // every gradient is multiplied by it first (clipping)
};

// A rank's attention under context parallelism: `batch` sequences of `seq` tokens (the two chunks
// it holds), `heads` query heads in `groups` key-value groups of `dim`.
struct AttentionDims {
  std::size_t batch, seq, heads, groups, dim;
};

// One block of a ring step (core/context_parallel.h's AttentionBlock, placed): the rank's query
// chunk (0 or 1) against the key-value chunk of the kv buffer, and their first tokens' places in
// the whole sequence.
struct AttentionChunkBlock {
  std::size_t query_chunk, key_chunk;
  int64_t query_first, key_first;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // The element type of activations and compute weights: fp32 on the CPU; bf16, or fp16 under
  // --fp16, on the GPU. A backend whose activations are fp32 makes each weight's compute copy the
  // master weight itself. Communicators move activations as this type.
  virtual DType activation_type() const = 0;
  // Bytes of one activation element (4 or 2), for memory estimates.
  std::size_t activation_bytes() const { return dtype_bytes(activation_type()); }
  // Bytes the backend could still allocate (the GPU's free memory; the host's available memory).
  virtual int64_t available_bytes() const = 0;

  // A zeroed fp32 buffer of n floats, owned by the backend until release() or its destruction.
  virtual float* allocate(std::size_t n) = 0;
  virtual void release(float* buffer) = 0;
  virtual Activation allocate_activation(std::size_t n) = 0;
  virtual void release(Activation buffer) = 0;
  // The compute copy of a master weight: `value` itself where the compute precision is fp32.
  virtual Activation compute_copy(float* value, std::size_t n) = 0;
  virtual void release_compute_copy(Activation copy, float* value) = 0;
  // copy = value in compute precision (after the weights change other than by adamw_step).
  virtual void refresh_compute_copy(const float* value, std::size_t n, Activation copy) = 0;
  // The most bytes allocated at once so far (megaplan's own buffers; for the log's peak memory).
  virtual int64_t peak_bytes() const = 0;
  virtual void upload(float* device, const float* host, std::size_t n) = 0;
  virtual void download(float* host, const float* device, std::size_t n) = 0;
  // Page-locks `bytes` of host memory from `host` (until unpin_host(host)) so that copies to and
  // from the device run at the bus's speed: checkpoints' host images, reused from save to save.
  // An upload from page-locked memory may still be reading it when upload() returns: the bytes stay
  // unchanged until the next download. Host memory needs no locking on the CPU backend.
  virtual void pin_host(void* host, std::size_t bytes) {
    (void)host;
    (void)bytes;
  }
  virtual void unpin_host(void* host) { (void)host; }
  // Activations to and from fp32 host values (tests and diagnostics; rounds to the compute type).
  virtual void upload(Activation device, const float* host, std::size_t n) = 0;
  virtual void download(float* host, ConstActivation device, std::size_t n) = 0;
  virtual void fill(float* x, std::size_t n, float value) = 0;
  // x[i] = element i of this rank's part of the normal tensor `draws` describes: its element
  // draws.part.whole_index(i) of the whole, as kernels/normal_draws.h defines it, bit for bit on
  // every backend (initialisation: each rank draws only its part, every layout the single rank's
  // values).
  virtual void draw_normal(float* x, std::size_t n, const NormalDraws& draws) = 0;

  // y[m x n] = epilogue(x[m x k] W^T + b), W stored [n x k] as Megatron stores a linear layer's
  // weight; a forward epilogue (is_forward_epilogue, else std::logic_error). kBiasGelu (tanh GELU)
  // also writes the pre-activation x W^T + b to `pre_activation`.
  virtual void linear_forward(ConstActivation x, ConstActivation w, ConstActivation b, std::size_t m, std::size_t k,
                              std::size_t n, GemmEpilogue epilogue, Activation y, Activation pre_activation) = 0;
  // dx[m x k] = dy W (dx may be null); dW += dy^T x and db += column sums of dy (dw may be null:
  // no weight gradient, and then db is null too; db may be null alone). Zero-bubble schedules take
  // the two halves at different times (I and W).
  virtual void linear_backward(ConstActivation dy, ConstActivation x, ConstActivation w, std::size_t m, std::size_t k,
                               std::size_t n, Activation dx, float* dw, float* db) = 0;
  // The input gradient of an MLP's second layer y = GELU(pre) W^T + b through its GELU (tanh):
  // d_pre[m x k] = (dy W) * GELU'(pre). Its weight gradient is linear_backward's, on GELU(pre).
  virtual void linear_backward_through_gelu(ConstActivation dy, ConstActivation w, std::size_t m, std::size_t k,
                                            std::size_t n, ConstActivation pre_activation, Activation d_pre) = 0;
  // Whether the three linear calls above can run Megatron's fp16 GEMMs: the profiler times them
  // for the simulator; the model never asks for them.
  virtual bool runs_fp16_gemms() const { return false; }
  // The linear calls' 16-bit operands, outputs and biases from now on: the activations' type
  // (kBf16), or fp16, the same buffers' bits read as fp16. REQUIRES: runs_fp16_gemms() for kFp16.
  virtual void set_gemm_precision(DType precision) {
    if (precision != DType::kBFloat16) throw std::logic_error(name() + " backend: no fp16 GEMMs");
  }
  // Token and learned position embeddings over `count` tokens (batch-major, `seq` per sequence).
  // `word` holds rows vocab_start .. vocab_start + vocab_rows of the (padded) vocabulary: all of it,
  // or a tensor-parallel rank's shard of a vocabulary-parallel table.
  // y[t] = (word[tokens[t] - vocab_start] where the token falls in the shard, else 0)
  //        + position[p] (position may be null: added by one rank of a tensor-parallel group), with
  // p = places.place(t % seq) the token's place in its sequence (context parallelism holds two
  // chunks of it; a default TokenPlaces, the whole sequence in order).
  virtual void embedding_forward(const int64_t* tokens, std::size_t count, std::size_t seq, ConstActivation word,
                                 std::size_t vocab_start, std::size_t vocab_rows, ConstActivation position,
                                 std::size_t hidden, Activation y, const TokenPlaces& places) = 0;
  // dword[tokens[t] - vocab_start] += dy[t] for the shard's tokens; dposition[p] += dy[t]
  // (dposition may be null).
  virtual void embedding_backward(ConstActivation dy, const int64_t* tokens, std::size_t count, std::size_t seq,
                                  std::size_t hidden, std::size_t vocab_start, std::size_t vocab_rows, float* dword,
                                  float* dposition, const TokenPlaces& places) = 0;
  // y = LayerNorm(x') with x' = x + dropout(residual) where residual is non-null (x' is then
  // written to sum_out: the residual stream's add with the branch's dropout, fused, as Megatron's
  // bias-dropout-add; an inactive residual_dropout adds the branch as it is); mean and rstd [rows]
  // for the backward.
  virtual void layernorm_forward(ConstActivation x, ConstActivation residual, const DropoutMask& residual_dropout,
                                 Activation sum_out, ConstActivation gamma, ConstActivation beta, std::size_t rows,
                                 std::size_t cols, Activation y, float* mean, float* rstd) = 0;
  // dx = d LayerNorm / dx' + residual_grad (when non-null: the residual stream's gradient flows
  // around the norm); dgamma, dbeta +=.
  virtual void layernorm_backward(ConstActivation dy, ConstActivation x, ConstActivation gamma, const float* mean,
                                  const float* rstd, std::size_t rows, std::size_t cols, ConstActivation residual_grad,
                                  Activation dx, float* dgamma, float* dbeta) = 0;
  // y = RMSNorm(x') * gamma with x' = x + dropout(residual) as layernorm_forward fuses it; rstd
  // [rows] for the backward; eps the model's --norm-epsilon.
  virtual void rmsnorm_forward(ConstActivation x, ConstActivation residual, const DropoutMask& residual_dropout,
                               Activation sum_out, ConstActivation gamma, std::size_t rows, std::size_t cols, float eps,
                               Activation y, float* rstd) = 0;
  // As layernorm_backward, without a bias.
  virtual void rmsnorm_backward(ConstActivation dy, ConstActivation x, ConstActivation gamma, const float* rstd,
                                std::size_t rows, std::size_t cols, ConstActivation residual_grad, Activation dx,
                                float* dgamma) = 0;
  // --qk-layernorm: RMSNorm over each query and key head of a fused qkv [tokens x groups x (group +
  // 2) x dim] (attention_forward's layout, read as rows of dim): each group's `group` query heads
  // by q_gamma, its key head by k_gamma [dim]; its value head copied to y as it is. rstd [tokens x
  // groups x (group + 2)], one per row (a value head's is written and never read).
  virtual void head_rmsnorm_forward(ConstActivation qkv, ConstActivation q_gamma, ConstActivation k_gamma,
                                    std::size_t tokens, std::size_t groups, std::size_t group, std::size_t dim,
                                    float eps, Activation y, float* rstd) = 0;
  // dx [as qkv] = the norms' gradient (a value head's: dy's); dx may be dy. dq_gamma, dk_gamma +=.
  virtual void head_rmsnorm_backward(ConstActivation dy, ConstActivation qkv, ConstActivation q_gamma,
                                     ConstActivation k_gamma, const float* rstd, std::size_t tokens, std::size_t groups,
                                     std::size_t group, std::size_t dim, Activation dx, float* dq_gamma,
                                     float* dk_gamma) = 0;
  // SwiGLU on fc1's output x [rows x 2 width] (the gate's columns, then the up projection's, as
  // Megatron's fused fc1 writes them per tensor-parallel shard): y [rows x width] = silu(gate) * up;
  // the backward overwrites dx [rows x 2 width].
  virtual void swiglu_forward(ConstActivation x, std::size_t rows, std::size_t width, Activation y) = 0;
  virtual void swiglu_backward(ConstActivation dy, ConstActivation x, std::size_t rows, std::size_t width,
                               Activation dx) = 0;
  // Rotary position embeddings (Megatron's default "rotate half") in place on the q and k heads of
  // a fused qkv [batch x seq x groups x (group + 2) x dim] (attention_forward's layout): each
  // group's `group` query heads and its key head, their first rotary_dim dimensions, by the angle
  // position x theta^(-2i / rotary_dim), scaled as `frequencies` asks (Llama 3.1, rope_frequency.h),
  // the position of token t of a sequence places.place(t); `inverse` rotates back (the backward, on
  // dqkv).
  virtual void rotary(Activation qkv, std::size_t batch, std::size_t seq, std::size_t groups, std::size_t group,
                      std::size_t dim, std::size_t rotary_dim, const RotaryFrequencies& frequencies, bool inverse,
                      const TokenPlaces& places) = 0;
  // Causal attention on a fused qkv [batch x seq x groups x (heads / groups + 2) x dim]: Megatron's
  // layout, each query group's query heads, then its key and value (heads == groups: each head's
  // q, k and v together); tensor parallelism cuts it by groups. Into out [batch x seq x heads x dim];
  // `saved` (attention_saved_size floats) holds what the backward needs besides qkv and out.
  virtual std::size_t attention_saved_size(std::size_t batch, std::size_t seq, std::size_t heads,
                                           std::size_t dim) const = 0;
  // `dropout` (attention dropout; inactive: none) drops probabilities after the softmax, with
  // heads numbered as this call's (the mask's first_head places them in the model's).
  virtual void attention_forward(ConstActivation qkv, std::size_t batch, std::size_t seq, std::size_t heads,
                                 std::size_t groups, std::size_t dim, const DropoutMask& dropout, Activation out,
                                 float* saved) = 0;
  // dqkv is overwritten (a key or value head's gradient summed over its group's queries); `dropout`
  // is the forward's.
  virtual void attention_backward(ConstActivation dout, ConstActivation qkv, ConstActivation out, const float* saved,
                                  std::size_t batch, std::size_t seq, std::size_t heads, std::size_t groups,
                                  std::size_t dim, const DropoutMask& dropout, Activation dqkv) = 0;
  // Ring attention (context parallelism, core/context_parallel.h), in blocks. The rank's qkv holds
  // its two chunks of each sequence, fused as attention_forward's with `seq` = 2 chunks of seq / 2
  // tokens; keys and values travel the ring packed, kv [batch x seq x groups x 2 x dim] (each
  // group's key, then its value). A key is visible to a query where its place in the whole sequence
  // is at most the query's; dropout.seq is the whole sequence's length, its mask drawn at the
  // tokens' places, so every cp layout draws the single rank's.
  // kv = qkv's keys and values.
  virtual void pack_key_values(ConstActivation qkv, const AttentionDims& dims, Activation kv) = 0;
  // dqkv's keys and values = dkv's (packed as kv); its queries unchanged.
  virtual void unpack_key_value_gradients(ConstActivation dkv, const AttentionDims& dims, Activation dqkv) = 0;
  // The queries of qkv's chunk block.query_chunk against the keys and values of kv's chunk
  // block.key_chunk, merged by their log-sum-exp into that chunk's rows of out [batch x seq x heads
  // x dim] and lse [batch x heads x seq] (fp32): before a row's first block out is 0 and lse -inf;
  // after its last, out is attention over every key its blocks showed it and lse the log of the
  // softmax's normaliser over the scaled scores.
  virtual void attention_block_forward(ConstActivation qkv, ConstActivation kv, const AttentionDims& dims,
                                       const AttentionChunkBlock& block, const DropoutMask& dropout, float* out,
                                       float* lse) = 0;
  // The block's share of the gradient from dout and the merged forward's out (in the compute type)
  // and lse: its queries' added to dqkv's query heads in the query chunk's rows, its keys' and
  // values' to dkv's key chunk rows.
  virtual void attention_block_backward(ConstActivation dout, ConstActivation qkv, ConstActivation out,
                                        const float* lse, ConstActivation kv, const AttentionDims& dims,
                                        const AttentionChunkBlock& block, const DropoutMask& dropout, Activation dqkv,
                                        Activation dkv) = 0;
  // y = x rounded to the compute type.
  virtual void convert(const float* x, std::size_t n, Activation y) = 0;
  // x = 0.
  virtual void zero(Activation x, std::size_t n) = 0;
  // y [rows x cols] = x with dropout's mask applied (kept elements scaled by 1 / (1 - p), the rest
  // 0), plus residual where non-null (the dropout-add, fused); rows are this rank's token rows, as
  // the mask places them. y may be x. The forward's dropout and its gradient alike (the same mask
  // drawn again).
  virtual void dropout(ConstActivation x, ConstActivation residual, std::size_t rows, std::size_t cols,
                       const DropoutMask& mask, Activation y) = 0;
  // Softmax cross entropy over a vocabulary that may be split across tensor-parallel ranks
  // (Megatron's vocabulary-parallel cross entropy): `logits` [tokens x vocab] are columns
  // vocab_start .. vocab_start + vocab of the whole (padded) vocabulary. The forward gives each
  // row's statistics over the shard, fp32 [tokens] each: lse = log sum exp(logits[t]), and
  // target_logit = logits[t][targets[t] - vocab_start] where the target falls in the shard, else 0.
  // `peak`, where not null, gets a second copy of lse (the start of the group's max). The shards'
  // statistics merge into the loss on the backend too (executor/model/vocabulary_parallel_loss.h),
  // so that the loss never waits on the host.
  virtual void cross_entropy_statistics(ConstActivation logits, const int64_t* targets, std::size_t tokens,
                                        std::size_t vocab, std::size_t vocab_start, float* lse, float* target_logit,
                                        float* peak) = 0;
  // shard_lse[t] = exp(shard_lse[t] - peak[t]): the shard's share of the row's sum of exponentials.
  virtual void cross_entropy_shift(const float* peak, std::size_t tokens, float* shard_lse) = 0;
  // Each token's share of the microbatch's loss, `weights` (host memory): its loss mask over the
  // count of the microbatch's masked tokens (those of its whole sequences: under context
  // parallelism more than this rank holds).
  // lse[t] = peak[t] + log(term_sum[t]) (peak itself where term_sum is null), and *loss_sum (one
  // double in backend memory) += the sum of weights[t] (lse - target).
  virtual void cross_entropy_finish(const float* peak, const float* term_sum, const float* target, const float* weights,
                                    std::size_t tokens, float* lse, double* loss_sum) = 0;
  // With the whole vocabulary's lse [tokens]: dlogits = scale * weights[t] *
  // (exp(logits - lse) - onehot(targets[t] - vocab_start)); dlogits may be logits itself.
  virtual void cross_entropy_backward(ConstActivation logits, const float* lse, const int64_t* targets,
                                      const float* weights, std::size_t tokens, std::size_t vocab,
                                      std::size_t vocab_start, float scale, Activation dlogits) = 0;
  virtual void add(ConstActivation a, ConstActivation b, std::size_t n, Activation y) = 0;  // y = a + b
  virtual void copy(ConstActivation from, std::size_t n, Activation to) = 0;
  // The activation `elements` elements into `a` (an expert's rows of a layer's, its weight's
  // slice): a view, never released on its own.
  virtual Activation offset(Activation a, std::size_t elements) = 0;

  // Mixture of experts (Megatron-Core's token-choice router, moe_routing.h; issue 40). Router
  // logits are activations [tokens x experts] (the router GEMM's output); scores, probabilities and
  // the logits' gradient are fp32. Index buffers hold int32 (allocate_indices, zeroed).
  virtual int32_t* allocate_indices(std::size_t n) = 0;
  virtual void release(int32_t* buffer) = 0;
  // Each token's top k experts, by descending choosing score (ties to the lower expert), into
  // experts [tokens x topk], and their probabilities into probs [tokens x topk]: softmax over every
  // expert then the top k (pre_softmax), or the top k logits then softmax over those, or sigmoid
  // scores chosen with `expert_bias` added ([experts] fp32, may be null) and the chosen sigmoids
  // normalised to sum 1 (for k > 1; Megatron adds 1e-20 to the sum); times scaling_factor.
  virtual void moe_top_k(ConstActivation logits, std::size_t tokens, const MoeRouter& router, const float* expert_bias,
                         int32_t* experts, float* probs) = 0;
  // Adds to d_logits [tokens x experts] the gradient of the probabilities' d_probs [tokens x topk]
  // (expert_bias moves the choice only, so the backward does not read it).
  virtual void moe_top_k_backward(ConstActivation logits, std::size_t tokens, const MoeRouter& router,
                                  const int32_t* experts, const float* d_probs, float* d_logits) = 0;
  // Adds to counts [experts] how many of `routes` routes (an experts list as moe_top_k writes it)
  // go to each expert: the tokens per expert Megatron logs and the expert bias moves by.
  virtual void moe_count_routes(const int32_t* experts, std::size_t routes, std::size_t expert_count,
                                float* counts) = 0;
  // The dispatch of the routes (moe_routing.h): writes `maps` (row_tokens sized for the most rows
  // the capacity allows: tokens x topk dropless, experts x capacity with one) and returns each
  // expert's rows, on the host (a GPU backend waits for them: the experts' GEMMs are sized by them).
  virtual std::vector<int64_t> moe_dispatch(const int32_t* experts, const float* probs, std::size_t tokens,
                                            const MoeRouter& router, const MoeCapacity& capacity,
                                            MoeDispatchMaps maps) = 0;
  // rows [rows x hidden] = x's row of each row's token.
  virtual void moe_permute(ConstActivation x, std::size_t hidden, const int32_t* row_tokens, std::size_t rows,
                           Activation out) = 0;
  // dx [tokens x hidden] (overwritten) = the sum of each token's kept routes' row gradients (a pad
  // row's gradient is 0: combine's backward writes it so).
  virtual void moe_permute_backward(ConstActivation d_rows, std::size_t hidden, const int32_t* token_rows,
                                    std::size_t tokens, std::size_t topk, Activation dx) = 0;
  // y [tokens x hidden] (overwritten) = Σ over each token's kept routes of prob · its row.
  virtual void moe_combine(ConstActivation rows, std::size_t hidden, const int32_t* token_rows, const float* probs,
                           std::size_t tokens, std::size_t topk, Activation y) = 0;
  // From dy: every row's gradient (overwritten, d_rows [rows x hidden]: prob · dy of its token, 0 for
  // a pad row) and each route's probability gradient (overwritten, d_probs [tokens x topk]: dy · its
  // row, 0 where dropped).
  virtual void moe_combine_backward(ConstActivation dy, ConstActivation rows, std::size_t hidden,
                                    ConstMoeDispatchMaps maps, const float* probs, std::size_t tokens, std::size_t topk,
                                    std::size_t rows_count, Activation d_rows, float* d_probs) = 0;
  // The counts [experts] (overwritten) of the load-balancing loss's own top k of these tokens: by
  // softmax over every expert, or the sigmoids normalised to sum 1 (never the expert bias).
  virtual void moe_aux_loss_counts(ConstActivation logits, std::size_t tokens, const MoeRouter& router,
                                   float* counts) = 0;
  // The switch load-balancing loss's share of these tokens, E·coeff/(k·T²) · Σ_i P_i·counts_i (P_i
  // these tokens' summed aux scores for expert i; counts and T = total_tokens those of the group
  // sharing the loss): added to *loss_sum where loss_sum is not null, its gradient times
  // gradient_scale added to d_logits where that is not null.
  virtual void moe_switch_loss(ConstActivation logits, std::size_t tokens, const MoeRouter& router, const float* counts,
                               std::size_t total_tokens, double coeff, double* loss_sum, float* d_logits,
                               float gradient_scale) = 0;
  // The sequence-level loss (seq_aux_loss): the tokens are `sequences` runs of tokens / sequences
  // rows, the loss the mean of each run's switch loss with its own counts; as moe_switch_loss.
  virtual void moe_sequence_aux_loss(ConstActivation logits, std::size_t tokens, std::size_t sequences,
                                     const MoeRouter& router, double coeff, double* loss_sum, float* d_logits,
                                     float gradient_scale) = 0;
  // ST-MoE's z loss, coeff · mean over the tokens of (logsumexp of a token's logits)²; as
  // moe_switch_loss.
  virtual void moe_z_loss(ConstActivation logits, std::size_t tokens, std::size_t experts, double coeff,
                          double* loss_sum, float* d_logits, float gradient_scale) = 0;
  // The aux-loss-free balancing step: expert_bias[i] += rate · sign(mean(counts) - counts[i]).
  virtual void moe_update_expert_bias(const float* counts, std::size_t experts, float rate, float* expert_bias) = 0;
  // The shared expert's gate (--moe-shared-expert-gate): y [rows x cols] += sigmoid(gate[r]) · x[r],
  // gate [rows] a GEMM's output of width 1. The backward overwrites dx = sigmoid(gate) · dy and
  // d_gate [rows] (fp32) = sigmoid'(gate) · Σ_c dy · x.
  virtual void sigmoid_gated_add(ConstActivation x, ConstActivation gate, std::size_t rows, std::size_t cols,
                                 Activation y) = 0;
  virtual void sigmoid_gated_add_backward(ConstActivation dy, ConstActivation x, ConstActivation gate, std::size_t rows,
                                          std::size_t cols, Activation dx, float* d_gate) = 0;

  // The sum of squares of every gradient, in a fixed order (the global gradient norm squared).
  virtual double gradient_sum_of_squares(const std::vector<OptimizerTensor>& tensors) = 0;
  // AdamW with decoupled weight decay on every tensor, then each compute copy refreshed.
  virtual void adamw_step(const std::vector<OptimizerTensor>& tensors, const AdamwSettings& settings) = 0;
  // Waits for queued work (timing); a no-op where work runs synchronously.
  virtual void synchronize() = 0;
  // The stream this backend issues its work on now (a cudaStream_t, as void* so that this header
  // needs no CUDA), which communicators order their operations after and make wait for their
  // results; null where work runs synchronously on the host. It changes only inside run_pair.
  virtual void* compute_stream() const = 0;
  // Issues `first`, then `second` (the host runs them in that order). A backend with streams issues
  // `second`'s work on a second stream that starts after everything issued before the call, and
  // makes everything issued after the call wait for both, so that the two may overlap on the device:
  // DualPipeV's OVERLAP_F_B, a backward and a forward of different chunks. REQUIRES: neither reads
  // or writes what the other writes. Not reentrant.
  virtual void run_pair(const std::function<void()>& first, const std::function<void()>& second) = 0;

  // Timing that follows the work rather than its issue. A mark is a point in the backend's stream
  // of work: the host's steady clock when reached on the CPU (work there is synchronous), an event
  // recorded on the stream the backend issues its work on for the GPU, so that the time between
  // two marks is what the device spent between them, not how long the host took to queue it.
  virtual TimingMark mark() = 0;
  // Seconds from `from` to `to`, waiting for `to` to be reached. REQUIRES: `from` was taken first.
  virtual double seconds_between(TimingMark from, TimingMark to) = 0;
  // Ends every mark taken so far; the backend reuses what held them (no per-mark cost once warm).
  virtual void release_marks() = 0;
};

// What core's layer recipe and memory walk need of a backend's storage (core/layer_recipe.h): its
// activations' bytes, and whether attention keeps more than one value per query row (the CPU
// reference keeps the probabilities).
inline ExecutorPrecision executor_precision(const Backend& backend) {
  return {static_cast<int64_t>(backend.activation_bytes()), backend.attention_saved_size(1, 2, 1, 1) > 2};
}

}  // namespace megaplan::exec
