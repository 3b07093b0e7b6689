// The decoder layer of megaplan's executor, described once: its widths on one tensor-parallel rank,
// the architecture's choices as its kernels take them, and every buffer a stage chunk allocates —
// what a layer keeps from its forward for its backward under each recomputation mode, the chunk's
// scratch, a microbatch's buffers outside its layers, and the output gradients I keeps for W.
//
// And its kernels, call for call: the kernel list the simulator costs (kernel_list.h's PlanKernels
// for megaplan's implementation) and the profiler times. The stage chunk
// (executor/model/stage_chunk.h) allocates exactly these buffers, reads these choices and launches
// these kernels; the memory walk (executor_memory.h) prices these buffers. Adding a kind of layer
// part (an attention variant, an MoE FFN) is a choice here, its buffers, its kernels, and the
// stage chunk's calls. tests/executor/model/kernel_list_test.cc records what the stage chunk
// launches and allocates and compares both with this description.
//
// The buffer structs are templates over what a buffer is: its size here (ActivationElements,
// FloatElements), a pointer in the executor. for_each_buffer() walks them field by field, so that
// allocation, release and pricing all follow the one field list.
#pragma once

#include <cstdint>
#include <optional>
#include <tuple>
#include <utility>

#include "core/kernel_list.h"
#include "core/model_spec.h"
#include "core/parallel_plan.h"
#include "core/pipeline_layout.h"

namespace megaplan {

// A transformer layer's dimensions on one tensor-parallel rank, as every kernel list uses them.
struct LayerDims {
  int64_t tokens;      // the GEMMs' rows: mbs * seq / cp
  int64_t rows;        // the residual stream's rows (norms, adds): tokens / tp with sequence parallelism
  int64_t hidden;      // h
  int64_t query;       // the query projection's width / tp
  int64_t key_value;   // K's (and V's) width / tp
  int64_t qkv;         // query + 2 key_value
  int64_t ffn;         // the MLP's hidden width / tp
  int64_t fc1;         // fc1's output width: ffn, twice that with SwiGLU
  int64_t vocabulary;  // the padded vocabulary / tp
  int64_t heads;       // attention heads / tp
  int64_t groups;      // key-value (query) groups / tp
  int64_t head_dim;
};
LayerDims layer_dims(const ModelSpec& model, const ParallelPlan& plan);

// What the executor's backend stores, where it decides a buffer's size.
struct ExecutorPrecision {
  int64_t activation_bytes = 2;  // bf16 (the CUDA backend); 4 on the CPU backend, whose weights need no copy
  // fp32 values attention keeps per query row and head for its backward: false, flash attention's
  // log-sum-exp (one); true, the CPU reference's probabilities (one per key).
  bool attention_keeps_probabilities = false;
};

// A buffer's size: elements in the compute type (activations) or in fp32 (statistics, the loss).
// 0: not allocated.
struct ActivationElements {
  int64_t count = 0;
};
struct FloatElements {
  int64_t count = 0;
};

// Elements of an int32 index buffer (an MoE dispatch's maps): four bytes each, as fp32's.
struct IndexElements {
  int64_t count = 0;
};

// The running loss sum at the head of the loss's memory: one double, in fp32 elements.
inline constexpr int64_t kLossSumFloats = sizeof(double) / sizeof(float);

// What one layer keeps for its backward. The residual stream's sums (input, middle) are written by
// the norms that follow them, which fuse the residual adds; the norms' outputs are not kept (the
// backward recomputes them from the stream: one pass over rows x hidden against two such buffers
// per layer). qkv is kept after the rotary embedding; fc1 is fc1's output (GELU's pre-activation,
// or SwiGLU's [gate; up]) and `activated` GELU's output, fc2's input (SwiGLU's is computed again in
// the backward). `attention_saved` is what attention's backward reads besides qkv and its output.
// With --qk-layernorm the QKV projection's output before its heads' norms (their backward's input,
// as Megatron keeps it) and each head's rstd (a value head's too, unread: the norms walk qkv's
// rows of head_dim whole).
template <typename A, typename F>
struct LayerBuffers {
  A input{}, qkv{}, attention{}, middle{}, fc1{}, activated{}, qk_input{};
  F ln1_mean{}, ln1_rstd{}, ln2_mean{}, ln2_rstd{}, attention_saved{}, qk_rstd{};
  auto fields() {
    return std::tie(input, qkv, attention, middle, fc1, activated, qk_input, ln1_mean, ln1_rstd, ln2_mean, ln2_rstd,
                    attention_saved, qk_rstd);
  }
  auto fields() const {
    return std::tie(input, qkv, attention, middle, fc1, activated, qk_input, ln1_mean, ln1_rstd, ln2_mean, ln2_rstd,
                    attention_saved, qk_rstd);
  }
};

// A microbatch's buffers outside its layers. output: the chunk's last residual sum (the final
// norm's input on the last stage, the message to the next stage elsewhere). On the last stage the
// head's: the final norm's output gathered (the output layer's input), the logits (the loss's
// gradient overwrites them), the final norm's statistics and each row's log-sum-exp.
template <typename A, typename F>
struct MicrobatchBuffers {
  A output{}, final_norm{}, logits{};
  F final_mean{}, final_rstd{}, loss_saved{};
  auto fields() { return std::tie(output, final_norm, logits, final_mean, final_rstd, loss_saved); }
  auto fields() const { return std::tie(output, final_norm, logits, final_mean, final_rstd, loss_saved); }
};

// The output gradient of each GEMM whose weight gradient I deferred to W, per layer.
template <typename A>
struct DeferredGradients {
  A qkv{}, proj{}, fc1{}, fc2{};
  auto fields() { return std::tie(qkv, proj, fc1, fc2); }
  auto fields() const { return std::tie(qkv, proj, fc1, fc2); }
};

// The chunk's scratch, one set, as F and B each run whole: a norm's output until the linear layer
// after it reads it; a branch's output until the next norm adds it to the stream; the backward's
// gradients at a layer's output and middle; the attention output's gradient (d_hidden: the wider of
// the stream and the rank's queries); the gradients of qkv and of fc1's output; SwiGLU's output
// (fc2's input in the forward, its gradient and then the output again in the backward). Under
// sequence parallelism the gathered rows and the partial sums before their reduce-scatter. On the
// last stage the loss's memory: the running loss sum (a double, two floats) and the row statistics
// [lse_s | target logit | peak] (vocabulary_parallel_loss.h). Under context parallelism the ring's
// (core/context_parallel.h): the packed keys and values attended to and those arriving from the
// previous rank; in the backward two buffers of their gradients (one filled while the other is
// sent on) and the sum arriving from the previous rank; the forward's running output (fp32).
template <typename A, typename F>
struct ChunkScratch {
  A norm_out{}, branch_out{}, d_hidden{}, d_out{}, d_middle{}, d_qkv{}, d_ffn{}, swiglu_out{}, d_activated{},
      gathered{}, partial{}, ring_kv{}, ring_kv_next{}, ring_dkv{}, ring_dkv_next{}, ring_dkv_in{};
  F loss_memory{}, ring_out{};
  auto fields() {
    return std::tie(norm_out, branch_out, d_hidden, d_out, d_middle, d_qkv, d_ffn, swiglu_out, d_activated, gathered,
                    partial, ring_kv, ring_kv_next, ring_dkv, ring_dkv_next, ring_dkv_in, loss_memory, ring_out);
  }
  auto fields() const {
    return std::tie(norm_out, branch_out, d_hidden, d_out, d_middle, d_qkv, d_ffn, swiglu_out, d_activated, gathered,
                    partial, ring_kv, ring_kv_next, ring_dkv, ring_dkv_next, ring_dkv_in, loss_memory, ring_out);
  }
};

using LayerBufferSizes = LayerBuffers<ActivationElements, FloatElements>;
using MicrobatchBufferSizes = MicrobatchBuffers<ActivationElements, FloatElements>;
using DeferredGradientSizes = DeferredGradients<ActivationElements>;
using ChunkScratchSizes = ChunkScratch<ActivationElements, FloatElements>;

// An MoE layer's MLP on one rank (executor/model/moe_mlp.h; issue 40): the tokens it routes (under
// tensor parallelism, whose MoE layers run with sequence parallelism, its own rows of the stream),
// its widths (each expert's and the shared expert's: the rank's shards of them), the experts it
// routes to (all of the layer's) and how many ranks hold them (ep: each holds experts / ep), each
// expert's capacity (0: dropless, else over the tokens it routes, as Megatron's), the most rows its
// dispatch makes (every route dropless; with a capacity at most experts x capacity, exactly that
// padded) and the rows that arrive for its experts (arrived_rows). At ep 1 those are the dispatch's
// rows. Under expert parallelism they are the rows the other ranks send it, known only after each
// dispatch (dropless, or a capacity unpadded): buffers sized by them are allocated for each forward,
// rounded up by moe_expert_rows; the recipe prices them at the plan's stated load
// (core/moe_kernel_list.h's moe_stated_load: the busiest rank's rows), at the balanced load as many
// rows as the rank's own dispatch makes (exactly that padded to capacity). Under tensor parallelism
// (etp = tp) the tp group's members all-gather their arrived rows, each member's padded to the
// group's most, and each computes its shard of every row: expert_rows() rows.
struct MoeDims {
  int64_t tokens = 0, hidden = 0, ffn = 0, shared_ffn = 0, experts = 0, topk = 0, capacity = 0, most_rows = 0;
  int64_t expert_parallel = 1, tensor_parallel = 1, arrived_rows = 0;
  // The routed experts' tensor-parallel size (--expert-tensor-parallel-size: tp, or 1 where each
  // rank holds its experts whole): the etp group's members gather the rows that arrive for its
  // experts and each computes its shard of every one. `tensor_parallel` is the dense layers' tp,
  // over whose rows the shared expert runs and whose tokens the router losses balance.
  int64_t expert_tensor_parallel = 1;
  // Context parallelism's size: each rank routes its own tokens of every sequence, and the switch
  // loss's counts, the z loss's share and the experts' load for the log span the cp group.
  int64_t context_parallel = 1;
  bool shared_gate = false;
  bool padded = false;  // every expert's rows padded to its capacity
  // The router losses a forward computes (those with a coefficient above 0): the switch loss over
  // the tokens, or over each of `aux_loss_sequences` sequences (seq_aux_loss); the z loss.
  bool aux_loss = false, z_loss = false;
  int64_t aux_loss_sequences = 0;
  int64_t local_experts() const { return experts / expert_parallel; }
  // The rows the rank's experts compute: every etp member's arrived rows (their room, padded).
  int64_t expert_rows() const { return expert_tensor_parallel * arrived_rows; }
  // The shared expert's rows: the tp group's tokens, gathered.
  int64_t shared_tokens() const { return tensor_parallel * tokens; }
};
// The dimensions of an MoE layer's MLP routing `tokens` tokens (capacity 0: dropless; `pad`:
// --moe-pad-expert-input-to-capacity), its experts over `expert_parallel` ranks and cut over
// `tensor_parallel` ranks (`ffn` and `shared_ffn`: a rank's shards), the tokens a rank's of a
// `context_parallel` group's.
MoeDims moe_dims(int64_t tokens, int64_t hidden, int64_t ffn, int64_t shared_ffn, bool shared_gate, int64_t experts,
                 int64_t topk, int64_t capacity, bool pad, int64_t expert_parallel, int64_t tensor_parallel = 1,
                 int64_t context_parallel = 1, int64_t expert_tensor_parallel = 0);
// The most rows a dispatch of `tokens` tokens' top-k routes makes (capacity 0: dropless).
int64_t moe_most_rows(int64_t tokens, int64_t topk, int64_t experts, int64_t capacity, bool pad);
// The rows to allocate for `rows` rows arriving for the rank's experts under expert parallelism: the
// balanced load's (the dispatch's most rows), or more rounded up to a sixteenth of those, so that
// a run asks its allocator for a few sizes only, whatever the load.
int64_t moe_expert_rows(int64_t rows, int64_t most_rows);

// What an MoE layer's forward keeps for its backward: the router's logits, each token's experts and
// probabilities, the dispatch's maps (each route's row, each row's token), the experts' outputs in
// the dispatch's order (combine's gradient reads them), the aux loss's counts, the shared expert's
// fc1 output and, gated, its output and the gate's logit; and, by the rows the rank's experts
// compute (MoeExpertBuffers), their input rows (fc1's input) and fc1's output.
template <typename A, typename F, typename I>
struct MoeLayerBuffers {
  A logits{}, expert_out{}, shared_fc1_out{}, shared_out{}, gate_logits{};
  F probs{}, aux_counts{};
  I experts{}, token_rows{}, row_tokens{};
  auto fields() {
    return std::tie(logits, expert_out, shared_fc1_out, shared_out, gate_logits, probs, aux_counts, experts, token_rows,
                    row_tokens);
  }
  auto fields() const {
    return std::tie(logits, expert_out, shared_fc1_out, shared_out, gate_logits, probs, aux_counts, experts, token_rows,
                    row_tokens);
  }
};
template <typename A>
struct MoeExpertBuffers {
  A rows{}, fc1_out{};
  auto fields() { return std::tie(rows, fc1_out); }
  auto fields() const { return std::tie(rows, fc1_out); }
};

// The MoE MLP's scratch, one set a chunk: the experts' outputs' gradient (in the dispatch's order),
// the logits' gradient in the compute type, a part of the input gradient (the shared expert's over
// its gathered rows), the shared expert's SwiGLU output and output (under tensor parallelism its
// partial sums over the gathered rows, and in the backward the gathered gradient), the gate logit's
// gradient; under tensor parallelism the shared expert's output on the rank's rows (and its
// gradient there); under expert parallelism the rows in the dispatch's order as they leave (and
// their gradients as they return); every tp and ep member's row counts per expert; fp32: the
// probabilities', the logits' and the gate's gradients, and the router losses' running sums (two
// doubles, for the log; under tensor parallelism room for every member's, gathered).
template <typename A, typename F>
struct MoeScratch {
  A d_expert_out{}, d_logits_compute{}, dx_part{}, shared_activated{}, shared_out{}, shared_rows{}, d_gate_compute{},
      sent{};
  F d_probs{}, d_logits{}, d_gate{}, loss_memory{}, counts{};
  auto fields() {
    return std::tie(d_expert_out, d_logits_compute, dx_part, shared_activated, shared_out, shared_rows, d_gate_compute,
                    sent, d_probs, d_logits, d_gate, loss_memory, counts);
  }
  auto fields() const {
    return std::tie(d_expert_out, d_logits_compute, dx_part, shared_activated, shared_out, shared_rows, d_gate_compute,
                    sent, d_probs, d_logits, d_gate, loss_memory, counts);
  }
};
// Its part sized by the rows the rank's experts compute: SwiGLU's output over them and its
// gradient (the shared expert's too), fc1's output's and the rows' gradients; under expert
// parallelism the rank's arrived rows grouped by the rank that sent them (as they arrive, and leave
// again); under tensor parallelism every member's arrived rows, gathered (each member's padded to
// the group's most).
template <typename A>
struct MoeExpertScratch {
  A activated{}, d_activated{}, d_fc1_out{}, d_rows{}, exchanged{}, gathered{};
  auto fields() { return std::tie(activated, d_activated, d_fc1_out, d_rows, exchanged, gathered); }
  auto fields() const { return std::tie(activated, d_activated, d_fc1_out, d_rows, exchanged, gathered); }
};

// What I (a schedule that splits the backward) keeps of an MoE layer's MLP until W: the output
// gradient of each weight GEMM it defers, in the compute type — the experts' fc2 and fc1 over the
// rows they compute, the router's logits', the shared expert's output's (over the tp group's rows,
// gathered) and its fc1's, the gate's. W reads them with what the forward kept (moe_kept,
// moe_expert_kept), so those stay until W too.
template <typename A>
struct MoeDeferred {
  A expert_fc2{}, expert_fc1{}, logits{}, shared_fc2{}, shared_fc1{}, gate{};
  auto fields() { return std::tie(expert_fc2, expert_fc1, logits, shared_fc2, shared_fc1, gate); }
  auto fields() const { return std::tie(expert_fc2, expert_fc1, logits, shared_fc2, shared_fc1, gate); }
};

using MoeLayerBufferSizes = MoeLayerBuffers<ActivationElements, FloatElements, IndexElements>;
using MoeExpertBufferSizes = MoeExpertBuffers<ActivationElements>;
using MoeScratchSizes = MoeScratch<ActivationElements, FloatElements>;
using MoeExpertScratchSizes = MoeExpertScratch<ActivationElements>;
MoeLayerBufferSizes moe_kept(const MoeDims& moe);
MoeExpertBufferSizes moe_expert_kept(const MoeDims& moe);
MoeScratchSizes moe_scratch(const MoeDims& moe);
MoeExpertScratchSizes moe_expert_scratch(const MoeDims& moe);
using MoeDeferredSizes = MoeDeferred<ActivationElements>;
MoeDeferredSizes moe_deferred(const MoeDims& moe);

// Calls fn(field) for each buffer of `buffers`, or fn(x_field, y_field) for each pair of the same
// field of two structs of one kind (a size and the buffer it describes, or two sets).
template <typename Buffers, typename Fn>
void for_each_buffer(Buffers&& buffers, Fn&& fn) {
  std::apply([&](auto&... field) { (fn(field), ...); }, buffers.fields());
}
template <typename X, typename Y, typename Fn>
void for_each_buffer(X&& x, Y&& y, Fn&& fn) {
  auto xs = x.fields();
  auto ys = y.fields();
  static_assert(std::tuple_size_v<decltype(xs)> == std::tuple_size_v<decltype(ys)>);
  [&]<std::size_t... I>(std::index_sequence<I...>) { (fn(std::get<I>(xs), std::get<I>(ys)), ...); }
  (std::make_index_sequence<std::tuple_size_v<decltype(xs)>>{});
}

// The bytes of every buffer a size struct lists.
template <typename Sizes>
int64_t buffer_bytes(const Sizes& sizes, int64_t activation_bytes) {
  int64_t bytes = 0;
  for_each_buffer(sizes, [&](const auto& size) {
    using Size = std::decay_t<decltype(size)>;
    bytes += size.count * (std::is_same_v<Size, ActivationElements> ? activation_bytes : int64_t{4});
  });
  return bytes;
}

// Whether an MoE layer keeping `keep` keeps its MLP's buffers (moe_kept, moe_expert_kept) for its
// backward: unless full recomputation runs it forward again, then on a set of the recomputation pool.
constexpr bool keeps_moe_buffers(LayerKeep keep) {
  return keep == LayerKeep::kAll || keep == LayerKeep::kAllButAttention;
}
// Whether the recomputation pool's sets of a chunk (its layers from `first_layer`, keeping `keeps`)
// hold an MoE MLP's buffers besides a layer's: where one of its MoE layers does not keep its own.
// Every set of such a chunk holds them, a dense layer's too, so that a set has one size.
bool lent_sets_hold_moe(const ModelSpec& model, int64_t first_layer, const std::vector<LayerKeep>& keeps);

// megaplan's decoder layer on one tensor-parallel rank of a plan.
struct LayerRecipe {
  LayerRecipe(const ModelSpec& model, const ParallelPlan& plan, const ExecutorPrecision& storage = {});

  LayerDims dims;
  int64_t micro_batch_size, seq_length;
  // The architecture's choices: RMSNorm or LayerNorm; SwiGLU (a kernel apart from fc1) or GELU,
  // which rides on fc1's bias epilogue and its derivative on fc2's input gradient (GELU without
  // biases is refused before training: executor_support.h); rotary embeddings on q and k.
  bool rms_norm, swiglu, fused_gelu, rope;
  int64_t rotary_dim;  // of each q and k head, the dimensions RoPE rotates
  // Biases on the linear layers (--add-bias-linear), and on QKV alone (--add-qkv-bias, Qwen2).
  bool linear_bias, qkv_bias;
  // --qk-layernorm: each query and key head RMS-normalised between the QKV projection and RoPE.
  bool qk_norm;
  // --hidden-dropout (each branch's output, and the embedding's) and --attention-dropout.
  bool hidden_dropout, attention_dropout;
  // Tensor parallelism (tp > 1: the loss merges the shards' statistics), and --sequence-parallel:
  // the stream's rows split over tp, gathered before each column-parallel GEMM.
  bool tensor_parallel, sequence_parallel;
  // Context parallelism's size: above 1 each rank holds two chunks of every sequence and attention
  // runs as a ring (core/context_parallel.h), keeping one log-sum-exp per query row on any backend.
  int64_t context_parallel;
  // The load the MoE layers' kernel lists assume (ParallelPlan::moe_imbalance).
  double moe_imbalance;
  DType gemm_precision;  // the GEMMs' operands: bf16, or fp16 under --fp16
  ExecutorPrecision precision;
  // A model with experts: its MoE layers' MLP (which layers, core/moe_spec.h's moe_layer).
  std::optional<MoeDims> moe;

  // What a layer keeps under `keep` (pipeline_layout.h): nothing; its input (full recomputation's
  // first layer of a group); everything but attention's output and saved statistics (selective
  // recomputation); everything. A set of the recomputation pool is kept(kAll). An MoE layer keeps
  // no dense MLP buffers: its MLP's are moe_kept's.
  LayerBufferSizes kept(LayerKeep keep, bool moe_layer = false) const;
  MicrobatchBufferSizes microbatch(bool last_stage) const;
  // An MoE layer defers its attention's (qkv, proj); its MLP's are moe_deferred's.
  DeferredGradientSizes deferred(bool moe_layer = false) const;
  // The first stage's embedding gradient, kept from I until W.
  ActivationElements deferred_embedding_gradient() const { return {dims.tokens * dims.hidden}; }
  ChunkScratchSizes scratch(bool last_stage) const;

  // The kernels, call for call as the stage chunk launches them, for GPT and the Llama family
  // (LayerNorm or RMSNorm, GELU in fc1's epilogue or SwiGLU apart, learned positions or RoPE,
  // grouped queries, biases or none): the layer's F (the first of a
  // stage or group, whose input norm adds nothing, and the others), B, I and W, selective
  // recomputation's attention, and the stage's embedding, head and boundary blocks. Row-parallel
  // biases are added by tensor-parallel rank 0 only. `ring`: ring_attention()'s, whose kernels stand
  // in each pass's attention under context parallelism. An MoE layer's blocks hold its MLP's
  // kernels (core/moe_kernel_list.h) at the plan's stated load, for F and B (MoE layers do not run
  // under schedules that split the backward).
  KernelBlocks kernel_blocks(int64_t tensor_parallel_rank, const RingAttentionPasses& ring) const;
  // An MoE layer's MLP at the plan's stated load (core/moe_kernel_list.h); empty without experts.
  MoeKernels moe_mlp_kernels() const;
  // Context parallelism's ring attention step by step, as the layer blocks list it flattened.
  RingAttentionPasses ring_attention() const;
};

}  // namespace megaplan
