// The kernels a plan's implementation launches for one microbatch on one GPU, in launch order:
// what a transformer layer, the embedding, the output layer and the stage boundaries run in each
// part of a schedule (F, B, I, W), and what the optimizer step runs.
//
// megaplan's executor: exactly the kernels and shapes its Backend sees, as its layer recipe lists
// them (core/layer_recipe.h). One description, three users: the simulator costs these lists from a profile
// (simulator/stage_costs), `megaplan profile` times each kernel class over the shapes plans produce
// (executor/runtime/kernel_profiler), and a test runs the CPU backend's model through a recording backend and checks it
// launches exactly these lists (tests/executor/model/kernel_list_test.cc).
//
// Megatron-LM (megatron_kernel_list.cc): the kernels its code launches with the plan's
// ImplementationOptions, read from Megatron-LM's source: Transformer Engine's or the local
// layers, unfused attention as batched GEMMs with the s x s scores, softmax and dropout passes,
// bias-GELU and bias-dropout-add fused or apart, the fp32 cross entropy, and each microbatch's
// gradient accumulation without gradient-accumulation fusion. Kernels megaplan does not launch
// are kElementwise passes of their bytes (costed by the profile's streaming bandwidth).
//
// Collectives are not kernels here: the simulator adds them from the plan's groups.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/collective.h"
#include "core/gemm.h"
#include "core/model_spec.h"
#include "core/parallel_plan.h"

namespace megaplan {

// Bytes of an fp32 value (statistics, master weights, gradients), as the lists count them.
inline constexpr int64_t kFp32 = 4;

enum class KernelKind : uint8_t {
  kGemm,
  kAttentionForward,
  kAttentionBackward,
  // Context parallelism's ring (core/context_parallel.h): one chunk block of queries against one of
  // keys and values, `seq` tokens each; `diagonal`, the same chunk, masked causally inside, else
  // unmasked. The forward merges into an fp32 output and log-sum-exp by their log-sum-exp; the
  // backward adds into the queries' gradient and the packed keys' and values' gradient.
  kAttentionBlockForward,
  kAttentionBlockBackward,
  kNormForward,     // LayerNorm; fused_residual: adds the residual branch first and writes the sum
  kNormBackward,    // fused_residual: adds the residual stream's gradient to dx
  kRmsNormForward,  // RMSNorm, as the two above
  kRmsNormBackward,
  // --qk-layernorm: RMSNorm over every query and key head of a fused qkv (`rows` tokens, `cols`
  // their qkv width, `heads` and `groups` the rank's, each head `head_dim` wide); value heads pass
  // through. The backward also sums both norms' weight gradients.
  kHeadRmsNormForward,
  kHeadRmsNormBackward,
  kSwigluForward,   // silu(gate) * up: `rows` tokens, `cols` the MLP's (sharded) width
  kSwigluBackward,  // the gate's and the up projection's gradients
  kRotary,          // RoPE in place on q and k: `rows` tokens, `cols` rotated elements per token
  kAdd,
  kCopy,
  kDropout,  // a dropout mask applied to `rows` tokens of `cols` (a branch's output, or its gradient)
  kFill,     // fp32 (the gradient buffer's zeroing)
  kZero,     // in the compute type
  kConvert,  // fp32 to the compute type (the ring's merged attention output)
  // The ring's keys and values out of qkv into one packed buffer [K | V] that travels, and their
  // gradients back into dqkv: `rows` tokens, `cols` the key-value width twice.
  kPackKeyValues,
  kUnpackKeyValueGradients,
  kEmbeddingForward,
  kEmbeddingBackward,
  kCrossEntropyForward,   // the rows' log-sum-exp and target logit over the vocabulary shard
  kCrossEntropyBackward,  // dlogits in place of the logits
  kCrossEntropyShift,     // tp > 1: each row's shard term exp(lse_s - peak) (`rows` tokens)
  kCrossEntropyFinish,    // each row's lse and the microbatch's mean loss, on the device (`rows` tokens)
  kGradientNorm,          // sum of squares of fp32 gradients
  kAdamw,                 // fp32 master weights, moments and gradients; writes the compute copy
  kRefreshCompute,        // compute copy from fp32 master weights
  // Mixture of experts (core/moe_kernel_list.h), one Backend call each: `rows` tokens, `cols` the
  // experts (router kernels) or the hidden width (row moves), `batch` the routes per token (top k;
  // 0 for the z loss, which has no choice); kMoePermute's `rows` are the rows it writes,
  // kMoeCombineBackward's `m` the dispatch's rows, the sequence aux loss's `m` the sequences.
  kMoeTopK,             // each token's top k experts and their probabilities from the router's logits
  kMoeTopKBackward,     // the probabilities' gradient into the logits'
  kMoeDispatch,         // each route's row and each row's token; the rows per expert to the host
  kMoePermute,          // each row from its token
  kMoePermuteBackward,  // each token's gradient summed from its routes' rows
  kMoeCombine,          // each token's output summed from its routes' rows by their probabilities
  kMoeCombineBackward,  // the rows' and the probabilities' gradients
  kMoeAuxCounts,        // the load-balancing loss's own choice of experts, counted
  kMoeSwitchLoss,       // the switch load-balancing loss's value (summed for the log)
  kMoeSwitchLossGradient,
  kMoeSequenceAuxLoss,  // seq_aux_loss: each sequence's switch loss
  kMoeSequenceAuxLossGradient,
  kMoeZLoss,  // ST-MoE's z loss
  kMoeZLossGradient,
  kSigmoidGatedAdd,          // the shared expert's output scaled by sigmoid(gate) and added
  kSigmoidGatedAddBackward,  // its gradient and the gate's
  // Aux-loss-free balancing at OPTIM: one MoE layer's expert bias moved toward balance by the rows
  // its experts were routed (`cols` experts, one row).
  kMoeUpdateExpertBias,
  kElementwise,  // a streaming pass of Megatron's the executor does not launch (its own bytes)
};

struct Kernel {
  KernelKind kind = KernelKind::kGemm;
  DType precision = DType::kBFloat16;  // of a GEMM's or attention's operands
  // GEMM: the layer's forward shape (m tokens, n outputs, k inputs) whatever the layout.
  GemmLayout layout = GemmLayout::kForward;
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  int64_t m = 0, n = 0, k = 0;
  // Attention: `batch` sequences of `seq` tokens, `heads` query heads of `head_dim` in `groups`
  // key-value groups (GQA; groups == heads without), causal. GEMM: `batch` > 1 products of this
  // shape in one strided-batched launch (unfused attention).
  int64_t batch = 0, seq = 0, heads = 0, head_dim = 0, groups = 0;
  // Row kernels, `rows` x `cols`: norms and embeddings (tokens x hidden), cross entropy (tokens x
  // the vocabulary shard), MoE kernels (above). Flat kernels (add, copy, fill, optimizer): `rows` elements, cols 1.
  // kElementwise: `rows` elements moving `cols` bytes each.
  int64_t rows = 0, cols = 0;
  // A norm's or kDropout's residual add fused in (kDropout: y = residual + dropout(x)).
  bool fused_residual = false;
  // A dropout mask drawn inside the kernel: an add-norm's branch is dropped before the add
  // (Megatron's bias-dropout-add fused into the norm), attention's probabilities are dropped.
  bool dropout = false;
  // A ring block on the diagonal (kAttentionBlockForward/Backward).
  bool diagonal = false;
  bool operator==(const Kernel&) const = default;
};

Kernel gemm_kernel(GemmLayout layout, GemmEpilogue epilogue, int64_t m, int64_t n, int64_t k);
// A streaming pass over `elements` moving `bytes_per_element` bytes each (kElementwise).
Kernel streaming_kernel(int64_t elements, int64_t bytes_per_element);
// groups 0: one per head (multi-head attention).
Kernel attention_kernel(KernelKind kind, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                        int64_t groups = 0, bool dropout = false);
Kernel row_kernel(KernelKind kind, int64_t rows, int64_t cols, bool fused_residual = false, bool dropout = false);
// An MoE kernel (kMoe*): `rows` x `cols` with `topk` routes per token and `m` as the kind says.
Kernel moe_kernel(KernelKind kind, int64_t rows, int64_t cols, int64_t topk, int64_t m = 0);
// A ring block of `chunk` query tokens against `chunk` key tokens (kAttentionBlockForward/Backward).
Kernel attention_block_kernel(KernelKind kind, int64_t batch, int64_t chunk, int64_t heads, int64_t head_dim,
                              int64_t groups, bool dropout, bool diagonal);
// An attention kernel's query heads per key-value group: 1 for multi-head attention.
int64_t gqa_ratio(const Kernel& attention);
Kernel flat_kernel(KernelKind kind, int64_t elements);
// The query and key norms (kHeadRmsNormForward/Backward) over `tokens` rows of a fused qkv.
Kernel head_norm_kernel(KernelKind kind, int64_t tokens, int64_t heads, int64_t groups, int64_t head_dim);

// FLOPs: a GEMM's 2mnk; attention's QK^T and PV, 2 x 2 x s^2 x d per sequence and head, half of
// that with causal masking (the executor's whole attention, a ring's diagonal block); its backward
// recomputes QK^T and runs four more products, 2.5 x the forward (FlashAttention-2).
inline constexpr double kAttentionBackwardFactor = 2.5;
double gemm_flops(int64_t m, int64_t n, int64_t k);
double attention_forward_flops(int64_t batch_heads, int64_t seq, int64_t head_dim, bool causal);
// A kernel's FLOPs by the rules above (a batched GEMM's `batch` products; the executor's attention
// is causal); memory-bound kernels count 0.
double kernel_flops(const Kernel& kernel);

// Bytes a kernel reads and writes once each, with activations of `activation_bytes` (2 for bf16):
// the x-axis of a memory-bound kernel's measured curve, and the roofline fallback's memory term.
int64_t kernel_bytes(const Kernel& kernel, int64_t activation_bytes);

// A memory-bound kernel's class: its name in profiles ("norm_forward", "add_norm_forward", ...).
// Every kind but GEMM and attention has one; the fused variants of the norms are classes of their own.
std::string memory_kernel_class(const Kernel& kernel);
// Every class name, for reading profiles.
const std::vector<std::string>& memory_kernel_classes();
std::string describe(const Kernel& kernel);  // one line, for test failures and traces

// The blocks a stage's part of a schedule is built from. Within one plan a block's kernels do not
// depend on the stage, so the simulator costs each block once and multiplies.
enum class KernelBlock : uint8_t {
  kEmbeddingForward,
  kLayerForwardFirst,         // a stage's or recomputed group's first layer: its input norm adds nothing
  kLayerForward,              // later layers: the input norm adds the previous layer's MLP branch
  kStageOutput,               // a non-last stage adds the last branch into the message it sends
  kHeadForward,               // final norm (adding the last branch), output layer, cross entropy
  kHeadBackward,              // B
  kHeadBackwardInput,         // I: the output layer's weight gradient waits for W
  kHeadWeightGradient,        // W
  kOutputGradientCopy,        // a non-last stage copies the received gradient into its scratch
  kAttentionRecompute,        // selective recomputation, before each layer's backward
  kLayerBackward,             // B
  kLayerBackwardInput,        // I: each weight GEMM's output gradient is copied and kept for W
  kLayerWeightGradient,       // W: the weight GEMMs, with the norms they read recomputed
  kInputGradientCopy,         // a non-first stage hands its input's gradient on
  kEmbeddingGradientDropout,  // B and I on the first stage: the embedding output's gradient through its dropout
  kEmbeddingGradientCopy,     // I on the first stage: the embedding's gradient waits for W
  kEmbeddingBackward,
  kMoeLayerForwardFirst,  // an MoE layer's, as the two above (core/moe_kernel_list.h)
  kMoeLayerForward,
  kMoeLayerBackward,        // B
  kMoeLayerBackwardInput,   // I
  kMoeLayerWeightGradient,  // W
  kMoeLayerRecomputeFirst,  // full recomputation's forward of an MoE layer again, as the two forwards
  kMoeLayerRecompute,
};
inline constexpr std::size_t kNumKernelBlocks = static_cast<std::size_t>(KernelBlock::kMoeLayerRecompute) + 1;

struct CountedBlock {
  KernelBlock block;
  int64_t count;
};

enum class SchedulePart : uint8_t { kForward, kBackward, kBackwardInput, kBackwardWeight };

using KernelBlocks = std::array<std::vector<Kernel>, kNumKernelBlocks>;

// Context parallelism's ring attention in one pass on one rank, step by step as the simulator
// costs it (core/context_parallel.h): the kernels before the ring, each step's kernels with the
// bytes sent to the next rank (and as many received from the previous one) while they run, the
// bytes exchanged after the last step with nothing beside them, and the kernels after. Each step
// is the same work on every rank. The layer's blocks list the same kernels flattened.
struct RingAttention {
  struct Step {
    std::vector<Kernel> kernels;
    int64_t exchanged_bytes = 0;
  };
  std::vector<Kernel> before;
  std::vector<Step> steps;
  int64_t trailing_bytes = 0;
  std::vector<Kernel> after;
  // Every kernel in launch order.
  std::vector<Kernel> kernels() const;
};
// Forward and backward; empty without context parallelism.
struct RingAttentionPasses {
  RingAttention forward, backward;
};

// The ring's exchanges over `cp` ranks of `key_value_bytes` each (the rank's packed keys and
// values), as both implementations run them, around `step_kernels(step, backward)` (the kernels of
// step `step`): in the forward each step but the last sends the keys and values in hand on; in the
// backward the keys and values travel so too, and each step's sum of their gradients follows one
// step behind, the last going home after the ring with nothing beside it.
RingAttentionPasses ring_attention_passes(int64_t cp, int64_t key_value_bytes,
                                          const std::function<std::vector<Kernel>(int64_t, bool)>& step_kernels);

// A collective of an MoE layer's MLP: over the rank's ep, tp (the shared expert, the losses), cp or
// etp group (the routed experts' rows, where it is not the tp group), its bytes as a profile's
// collective tables count them (an all-gather's output, a reduce-scatter's input, an all-to-all's
// larger side: what the rank sends or what it receives).
enum class MoeGroup : uint8_t { kExpert, kTensor, kContext, kExpertTensor };
struct MoeCollective {
  MoeGroup group;
  CollectiveOp op;
  int64_t bytes;
  bool operator==(const MoeCollective& other) const {
    return group == other.group && op == other.op && bytes == other.bytes;
  }
};

// An MoE layer's MLP in one pass on one rank (core/moe_kernel_list.h): its kernels and its
// collectives, each in launch order (the executor waits for every collective before it goes on).
struct MoeKernels {
  // `forward_again`: full recomputation's forward, which adds nothing to the router losses' log;
  // `backward_input` and `weight`: a split backward's I (its collectives the backward's) and W.
  std::vector<Kernel> forward, forward_again, backward, backward_input, weight;
  std::vector<MoeCollective> forward_collectives, forward_again_collectives, backward_collectives, weight_collectives;
};

// megaplan's executor: core/layer_recipe.h's LayerRecipe::kernel_blocks and ring_attention.
// Megatron-LM's, by plan.options (megatron_kernel_list.cc); `ring`, megatron_ring_attention's, stands
// in the attention core under context parallelism.
RingAttentionPasses megatron_ring_attention(const ModelSpec& model, const ParallelPlan& plan);
KernelBlocks megatron_kernel_blocks(const ModelSpec& model, const ParallelPlan& plan, const RingAttentionPasses& ring);

// What the kernel lists and the memory models cost of a model with experts: megaplan's MoE layers
// (core/moe_kernel_list.h) where its executor runs them. Throws SpecError naming the flag for
// Megatron-LM's MoE layers and for what core/executor_support.h's executor_moe_refusal refuses.
void require_costed_layers(const ModelSpec& model, const ParallelPlan& plan);

// The kernels of the plan's implementation, by block and by stage.
class PlanKernels {
 public:
  // REQUIRES: validate_plan(model, plan) passed. `tensor_parallel_rank` matters to megaplan's
  // executor only; rank 0's list (which adds the row-parallel biases) is the one the simulator costs.
  PlanKernels(const ModelSpec& model, const ParallelPlan& plan, int64_t tensor_parallel_rank = 0);

  const std::vector<Kernel>& block(KernelBlock block) const { return blocks_[static_cast<std::size_t>(block)]; }
  // The ring attention inside the layer blocks, step by step (empty without context parallelism).
  const RingAttentionPasses& ring() const { return ring_; }
  // An MoE layer's MLP at the plan's stated load (empty lists without experts): its exchanges' sizes.
  const MoeKernels& moe() const { return moe_; }
  // One microbatch's part on a virtual stage, as blocks in launch order.
  std::vector<CountedBlock> stage_blocks(int64_t stage, SchedulePart part) const;
  // The same, expanded into kernels.
  std::vector<Kernel> stage_kernels(int64_t stage, SchedulePart part) const;

 private:
  ModelSpec model_;
  ParallelPlan plan_;
  KernelBlocks blocks_;
  RingAttentionPasses ring_;
  MoeKernels moe_;
};

// OPTIM on one pipeline rank: the gradient norm over `norm_elements` (each tied or replicated
// tensor counted once) and, with experts, over the routed experts' `expert_norm_elements` apart,
// AdamW over the `stepped_elements` the rank updates (its shard with the distributed optimizer),
// the compute copies of `refreshed_elements` gathered parameters (the distributed optimizer with
// dp > 1; 0 otherwise), and each chunk's gradient buffer zeroed (`gradient_buffer_elements`, one
// entry per chunk).
std::vector<Kernel> optimizer_kernels(int64_t norm_elements, int64_t stepped_elements, int64_t refreshed_elements,
                                      const std::vector<int64_t>& gradient_buffer_elements,
                                      int64_t expert_norm_elements = 0);

// OPTIM's expert-bias updates before the norm (--moe-router-enable-expert-bias): one per MoE layer
// on the pipeline rank, over the model's experts; empty without the bias.
std::vector<Kernel> expert_bias_kernels(const ModelSpec& model, int64_t moe_layers);

// OPTIM of the plan's implementation on a pipeline rank holding `parameters_per_gpu`, of which
// `expert_parameters_per_gpu` are routed experts'; collectives excluded. megaplan: optimizer_kernels
// over the rank's parameters (the distributed optimizer steps its shard, the experts' over expert
// dp, and refreshes the gathered copies). Megatron: with fp16 gradients their fp32 copies; with fp16
// the loss scale's unscale-and-check; the norm, Adam and the master-to-model copy over the (shard of
// the) parameters; the main-gradient buffer zeroed.
std::vector<Kernel> optimizer_step_kernels(const ParallelPlan& plan, int64_t parameters_per_gpu,
                                           int64_t expert_parameters_per_gpu = 0);

}  // namespace megaplan
