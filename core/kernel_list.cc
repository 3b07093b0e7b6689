// Kernels: their FLOPs, bytes and classes; a plan's lists by block and stage; the optimizer's.
#include "core/kernel_list.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "core/error.h"
#include "core/executor_support.h"
#include "core/formulas.h"
#include "core/layer_recipe.h"
#include "core/pipeline_layout.h"

namespace megaplan {

namespace {

struct ClassName {
  KernelKind kind;
  bool fused_residual;
  bool dropout;
  const char* name;
};
constexpr std::array<ClassName, 51> kClassNames = {{
    {KernelKind::kNormForward, false, false, "norm_forward"},
    {KernelKind::kNormForward, true, false, "add_norm_forward"},
    {KernelKind::kNormForward, true, true, "dropout_add_norm_forward"},
    {KernelKind::kNormBackward, false, false, "norm_backward"},
    {KernelKind::kNormBackward, true, false, "norm_backward_add"},
    {KernelKind::kRmsNormForward, false, false, "rmsnorm_forward"},
    {KernelKind::kRmsNormForward, true, false, "add_rmsnorm_forward"},
    {KernelKind::kRmsNormForward, true, true, "dropout_add_rmsnorm_forward"},
    {KernelKind::kRmsNormBackward, false, false, "rmsnorm_backward"},
    {KernelKind::kRmsNormBackward, true, false, "rmsnorm_backward_add"},
    {KernelKind::kHeadRmsNormForward, false, false, "head_rmsnorm_forward"},
    {KernelKind::kHeadRmsNormBackward, false, false, "head_rmsnorm_backward"},
    {KernelKind::kSwigluForward, false, false, "swiglu_forward"},
    {KernelKind::kSwigluBackward, false, false, "swiglu_backward"},
    {KernelKind::kRotary, false, false, "rotary"},
    {KernelKind::kAdd, false, false, "add"},
    {KernelKind::kCopy, false, false, "copy"},
    {KernelKind::kDropout, false, false, "dropout"},
    {KernelKind::kDropout, true, false, "dropout_add"},
    {KernelKind::kFill, false, false, "fill"},
    {KernelKind::kZero, false, false, "zero"},
    {KernelKind::kConvert, false, false, "convert"},
    {KernelKind::kPackKeyValues, false, false, "pack_key_values"},
    {KernelKind::kUnpackKeyValueGradients, false, false, "unpack_key_value_gradients"},
    {KernelKind::kEmbeddingForward, false, false, "embedding_forward"},
    {KernelKind::kEmbeddingBackward, false, false, "embedding_backward"},
    {KernelKind::kCrossEntropyForward, false, false, "cross_entropy_forward"},
    {KernelKind::kCrossEntropyBackward, false, false, "cross_entropy_backward"},
    {KernelKind::kCrossEntropyShift, false, false, "cross_entropy_shift"},
    {KernelKind::kCrossEntropyFinish, false, false, "cross_entropy_finish"},
    {KernelKind::kGradientNorm, false, false, "gradient_norm"},
    {KernelKind::kAdamw, false, false, "adamw"},
    {KernelKind::kRefreshCompute, false, false, "refresh_compute"},
    {KernelKind::kMoeTopK, false, false, "moe_top_k"},
    {KernelKind::kMoeTopKBackward, false, false, "moe_top_k_backward"},
    {KernelKind::kMoeDispatch, false, false, "moe_dispatch"},
    {KernelKind::kMoePermute, false, false, "moe_permute"},
    {KernelKind::kMoePermuteBackward, false, false, "moe_permute_backward"},
    {KernelKind::kMoeCombine, false, false, "moe_combine"},
    {KernelKind::kMoeCombineBackward, false, false, "moe_combine_backward"},
    {KernelKind::kMoeAuxCounts, false, false, "moe_aux_counts"},
    {KernelKind::kMoeSwitchLoss, false, false, "moe_switch_loss"},
    {KernelKind::kMoeSwitchLossGradient, false, false, "moe_switch_loss_gradient"},
    {KernelKind::kMoeSequenceAuxLoss, false, false, "moe_sequence_aux_loss"},
    {KernelKind::kMoeSequenceAuxLossGradient, false, false, "moe_sequence_aux_loss_gradient"},
    {KernelKind::kMoeZLoss, false, false, "moe_z_loss"},
    {KernelKind::kMoeZLossGradient, false, false, "moe_z_loss_gradient"},
    {KernelKind::kSigmoidGatedAdd, false, false, "sigmoid_gated_add"},
    {KernelKind::kSigmoidGatedAddBackward, false, false, "sigmoid_gated_add_backward"},
    {KernelKind::kMoeUpdateExpertBias, false, false, "moe_update_expert_bias"},
    {KernelKind::kElementwise, false, false, "elementwise"},
}};

}  // namespace

Kernel gemm_kernel(GemmLayout layout, GemmEpilogue epilogue, int64_t m, int64_t n, int64_t k) {
  Kernel kernel;
  kernel.kind = KernelKind::kGemm;
  kernel.layout = layout;
  kernel.epilogue = epilogue;
  kernel.m = m;
  kernel.n = n;
  kernel.k = k;
  return kernel;
}

Kernel attention_kernel(KernelKind kind, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, int64_t groups,
                        bool dropout) {
  Kernel kernel;
  kernel.dropout = dropout;
  kernel.kind = kind;
  kernel.batch = batch;
  kernel.seq = seq;
  kernel.heads = heads;
  kernel.head_dim = head_dim;
  kernel.groups = groups > 0 ? groups : heads;
  return kernel;
}

Kernel attention_block_kernel(KernelKind kind, int64_t batch, int64_t chunk, int64_t heads, int64_t head_dim,
                              int64_t groups, bool dropout, bool diagonal) {
  Kernel kernel = attention_kernel(kind, batch, chunk, heads, head_dim, groups, dropout);
  kernel.diagonal = diagonal;
  return kernel;
}

int64_t gqa_ratio(const Kernel& attention) { return attention.heads / std::max<int64_t>(attention.groups, 1); }

Kernel row_kernel(KernelKind kind, int64_t rows, int64_t cols, bool fused_residual, bool dropout) {
  Kernel kernel;
  kernel.dropout = dropout;
  kernel.kind = kind;
  kernel.rows = rows;
  kernel.cols = cols;
  kernel.fused_residual = fused_residual;
  return kernel;
}

Kernel flat_kernel(KernelKind kind, int64_t elements) { return row_kernel(kind, elements, 1); }

Kernel head_norm_kernel(KernelKind kind, int64_t tokens, int64_t heads, int64_t groups, int64_t head_dim) {
  Kernel kernel = row_kernel(kind, tokens, (heads + 2 * groups) * head_dim);
  kernel.heads = heads;
  kernel.groups = groups;
  kernel.head_dim = head_dim;
  return kernel;
}

Kernel moe_kernel(KernelKind kind, int64_t rows, int64_t cols, int64_t topk, int64_t m) {
  Kernel kernel = row_kernel(kind, rows, cols);
  kernel.batch = topk;
  kernel.m = m;
  return kernel;
}

Kernel streaming_kernel(int64_t elements, int64_t bytes_per_element) {
  return row_kernel(KernelKind::kElementwise, elements, bytes_per_element);
}

double gemm_flops(int64_t m, int64_t n, int64_t k) {
  return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
}

double attention_forward_flops(int64_t batch_heads, int64_t seq, int64_t head_dim, bool causal) {
  const double flops = 4.0 * static_cast<double>(batch_heads) * static_cast<double>(seq) * static_cast<double>(seq) *
                       static_cast<double>(head_dim);
  return causal ? flops / 2 : flops;
}

double kernel_flops(const Kernel& kernel) {
  switch (kernel.kind) {
    case KernelKind::kGemm:
      return static_cast<double>(std::max<int64_t>(kernel.batch, 1)) * gemm_flops(kernel.m, kernel.n, kernel.k);
    case KernelKind::kAttentionForward:
      return attention_forward_flops(kernel.batch * kernel.heads, kernel.seq, kernel.head_dim, /*causal=*/true);
    case KernelKind::kAttentionBackward:
      return kAttentionBackwardFactor *
             attention_forward_flops(kernel.batch * kernel.heads, kernel.seq, kernel.head_dim, /*causal=*/true);
    case KernelKind::kAttentionBlockForward:
      return attention_forward_flops(kernel.batch * kernel.heads, kernel.seq, kernel.head_dim, kernel.diagonal);
    case KernelKind::kAttentionBlockBackward:
      return kAttentionBackwardFactor *
             attention_forward_flops(kernel.batch * kernel.heads, kernel.seq, kernel.head_dim, kernel.diagonal);
    default: return 0;
  }
}

int64_t kernel_bytes(const Kernel& kernel, int64_t activation_bytes) {
  const int64_t a = activation_bytes;
  const int64_t cells = kernel.rows * kernel.cols;
  const int64_t statistics = 2 * kFp32 * kernel.rows;  // a norm's mean and rstd, a loss row's two values
  switch (kernel.kind) {
    case KernelKind::kGemm: {
      // Operands and result once each (a weight gradient accumulates into fp32); the GELU
      // epilogues also write or read the pre-activation.
      const bool weight = kernel.layout == GemmLayout::kWeightGradient;
      const int64_t gelu = kernel.epilogue == GemmEpilogue::kBiasGelu       ? kernel.m * kernel.n
                           : kernel.epilogue == GemmEpilogue::kGeluGradient ? kernel.m * kernel.k
                                                                            : 0;
      const int64_t products = std::max<int64_t>(1, kernel.batch);
      return products *
             (a * (kernel.m * kernel.n + kernel.m * kernel.k + gelu) + (weight ? 2 * kFp32 : a) * kernel.n * kernel.k);
    }
    case KernelKind::kAttentionForward:  // q, k, v in, o out, the log-sum-exp rows; k and v per group
      return 2 * a * kernel.batch * kernel.seq * (kernel.heads + kernel.groups) * kernel.head_dim +
             kFp32 * kernel.batch * kernel.heads * kernel.seq;
    case KernelKind::kAttentionBackward:  // q, k, v, o, do in, dq, dk, dv out
      return 4 * a * kernel.batch * kernel.seq * (kernel.heads + kernel.groups) * kernel.head_dim +
             kFp32 * kernel.batch * kernel.heads * kernel.seq;
    case KernelKind::kAttentionBlockForward:  // q, k, v in; the fp32 output and log-sum-exp read and written
      return a * kernel.batch * kernel.seq * (kernel.heads + 2 * kernel.groups) * kernel.head_dim +
             2 * kFp32 * kernel.batch * kernel.heads * kernel.seq * (kernel.head_dim + 1);
    case KernelKind::kAttentionBlockBackward:  // q, k, v, o, do, lse in; dq, dk, dv read and written
      return 4 * a * kernel.batch * kernel.seq * (kernel.heads + kernel.groups) * kernel.head_dim +
             kFp32 * kernel.batch * kernel.heads * kernel.seq;
    case KernelKind::kNormForward:  // x (+ the branch, + the sum written) in, y out
      return a * cells * (kernel.fused_residual ? 4 : 2) + statistics;
    case KernelKind::kNormBackward:  // dy, x (+ the stream's gradient) in, dx out
      return a * cells * (kernel.fused_residual ? 4 : 3) + statistics;
    case KernelKind::kRmsNormForward:  // as LayerNorm's, with one statistic (rstd) per row
      return a * cells * (kernel.fused_residual ? 4 : 2) + kFp32 * kernel.rows;
    case KernelKind::kRmsNormBackward: return a * cells * (kernel.fused_residual ? 4 : 3) + kFp32 * kernel.rows;
    // qkv in, out (value heads copied); one statistic per head of the fused rows (core/layer_recipe.h).
    case KernelKind::kHeadRmsNormForward: return 2 * a * cells + kFp32 * (cells / kernel.head_dim);
    case KernelKind::kHeadRmsNormBackward:  // dy and qkv in, dx out
      return 3 * a * cells + kFp32 * (cells / kernel.head_dim);
    case KernelKind::kSwigluForward:  // gate and up in, the product out
      return 3 * a * cells;
    case KernelKind::kSwigluBackward:  // dy, gate and up in, their two gradients out
      return 5 * a * cells;
    case KernelKind::kRotary:  // read and written in place
      return 2 * a * cells;
    case KernelKind::kAdd: return 3 * a * cells;
    case KernelKind::kCopy: return 2 * a * cells;
    case KernelKind::kDropout:  // read (+ the residual), then written masked (the mask is drawn, not read)
      return a * cells * (kernel.fused_residual ? 3 : 2);
    case KernelKind::kFill:
    case KernelKind::kGradientNorm: return kFp32 * cells;
    case KernelKind::kZero: return a * cells;
    case KernelKind::kConvert: return (kFp32 + a) * cells;
    case KernelKind::kPackKeyValues:  // read from qkv, written packed; and back
    case KernelKind::kUnpackKeyValueGradients: return 2 * a * cells;
    case KernelKind::kEmbeddingForward:  // a word row and a position row read, the sum written
      return 3 * a * cells;
    case KernelKind::kEmbeddingBackward:  // dy read; the word and position gradients (fp32) read and written
      return a * cells + 4 * kFp32 * cells;
    case KernelKind::kCrossEntropyForward: return a * cells + statistics;
    case KernelKind::kCrossEntropyBackward:  // logits in, their gradient out (in place), the rows' lse
      return 2 * a * cells + kFp32 * kernel.rows;
    case KernelKind::kCrossEntropyShift:  // lse_s and peak in, the term out
      return 3 * kFp32 * kernel.rows;
    case KernelKind::kCrossEntropyFinish:  // peak, term sum, target logit, mask in; lse out
      return 5 * kFp32 * kernel.rows;
    case KernelKind::kAdamw:  // master weight, both moments read and written, gradient read, compute copy written
      return (7 * kFp32 + a) * cells;
    case KernelKind::kRefreshCompute: return (kFp32 + a) * cells;
    case KernelKind::kElementwise: return cells;
    // Mixture of experts: int32 maps and fp32 probabilities and counts are four bytes a value.
    case KernelKind::kMoeTopK:  // the logits in; each route's expert and probability out
      return a * cells + 2 * kFp32 * kernel.rows * kernel.batch;
    case KernelKind::kMoeTopKBackward:  // the logits, the routes and their gradient in; the logits' (fp32) read and
                                        // written
      return a * cells + 2 * kFp32 * kernel.rows * kernel.batch + 2 * kFp32 * cells;
    case KernelKind::kMoeDispatch:  // the routes in; each route's row and each row's token out
      return 4 * kFp32 * kernel.rows * kernel.batch;
    case KernelKind::kMoePermute:  // each row read from its token and written, with its token's index
      return 2 * a * cells + kFp32 * kernel.rows;
    case KernelKind::kMoePermuteBackward:  // every route's row gradient read, each token's written
    case KernelKind::kMoeCombine:          // every route's row and probability read, each token's output written
      return a * cells * (kernel.batch + 1) + 2 * kFp32 * kernel.rows * kernel.batch;
    case KernelKind::kMoeCombineBackward:  // dy and the rows read, the rows' gradient written; the routes' gradients
      return a * (cells + 2 * kernel.m * kernel.cols) + 3 * kFp32 * kernel.rows * kernel.batch;
    case KernelKind::kMoeAuxCounts:  // the logits in, the counts out
    case KernelKind::kMoeSwitchLoss:
    case KernelKind::kMoeSequenceAuxLoss:
    case KernelKind::kMoeZLoss: return a * cells;
    case KernelKind::kMoeSwitchLossGradient:  // the logits in, their gradient (fp32) read and written
    case KernelKind::kMoeSequenceAuxLossGradient:
    case KernelKind::kMoeZLossGradient: return a * cells + 2 * kFp32 * cells;
    case KernelKind::kSigmoidGatedAdd:  // x and y read, y written; the gate per row
      return 3 * a * cells + a * kernel.rows;
    case KernelKind::kSigmoidGatedAddBackward:  // dy and x read, dx written; the gate and its gradient per row
      return 3 * a * cells + (a + kFp32) * kernel.rows;
    case KernelKind::kMoeUpdateExpertBias:  // the counts read, the bias read and written
      return 3 * kFp32 * cells;
  }
  return 0;
}

std::string memory_kernel_class(const Kernel& kernel) {
  for (const ClassName& entry : kClassNames) {
    if (entry.kind == kernel.kind && entry.fused_residual == kernel.fused_residual && entry.dropout == kernel.dropout) {
      return entry.name;
    }
  }
  return "";
}

const std::vector<std::string>& memory_kernel_classes() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> result;
    for (const ClassName& entry : kClassNames) {
      result.emplace_back(entry.name);
    }
    return result;
  }();
  return names;
}

std::string describe(const Kernel& kernel) {
  std::ostringstream out;
  switch (kernel.kind) {
    case KernelKind::kGemm:
      out << "gemm " << to_string(kernel.layout) << " " << to_string(kernel.epilogue) << " m=" << kernel.m
          << " n=" << kernel.n << " k=" << kernel.k;
      if (kernel.batch > 1) out << " batch=" << kernel.batch;
      break;
    case KernelKind::kAttentionForward:
    case KernelKind::kAttentionBackward:
    case KernelKind::kAttentionBlockForward:
    case KernelKind::kAttentionBlockBackward: {
      const bool block =
          kernel.kind == KernelKind::kAttentionBlockForward || kernel.kind == KernelKind::kAttentionBlockBackward;
      const bool forward =
          kernel.kind == KernelKind::kAttentionForward || kernel.kind == KernelKind::kAttentionBlockForward;
      out << (block ? "attention_block_" : "attention_") << (forward ? "forward" : "backward")
          << " batch=" << kernel.batch << " seq=" << kernel.seq << " heads=" << kernel.heads
          << " head_dim=" << kernel.head_dim;
      if (kernel.groups != kernel.heads) out << " groups=" << kernel.groups;
      if (kernel.dropout) out << " dropout";
      if (block) out << (kernel.diagonal ? " diagonal" : " full");
      break;
    }
    default:
      out << memory_kernel_class(kernel) << " rows=" << kernel.rows << " cols=" << kernel.cols;
      if (kernel.batch > 0) out << " topk=" << kernel.batch;
      if (kernel.m > 0) out << " m=" << kernel.m;
      if (kernel.head_dim > 0)
        out << " heads=" << kernel.heads << " groups=" << kernel.groups << " head_dim=" << kernel.head_dim;
  }
  if (kernel.precision != DType::kBFloat16) out << " " << to_string(kernel.precision);
  return out.str();
}

std::vector<Kernel> RingAttention::kernels() const {
  std::vector<Kernel> all = before;
  for (const Step& step : steps) all.insert(all.end(), step.kernels.begin(), step.kernels.end());
  all.insert(all.end(), after.begin(), after.end());
  return all;
}

RingAttentionPasses ring_attention_passes(int64_t cp, int64_t key_value_bytes,
                                          const std::function<std::vector<Kernel>(int64_t, bool)>& step_kernels) {
  RingAttentionPasses passes;
  for (int64_t step = 0; step < cp; ++step) {
    const bool onward = step + 1 < cp;  // keys and values still to pass on
    passes.forward.steps.push_back({step_kernels(step, false), onward ? key_value_bytes : 0});
    // Beside step s: the keys and values for step s + 1 and the sum step s - 1 made.
    const int64_t exchanged = (onward ? key_value_bytes : 0) + (step > 0 ? key_value_bytes : 0);
    passes.backward.steps.push_back({step_kernels(step, true), exchanged});
  }
  passes.backward.trailing_bytes = key_value_bytes;
  return passes;
}

void require_costed_layers(const ModelSpec& model, const ParallelPlan& plan) {
  if (!model.moe.enabled()) return;
  if (plan.implementation != Implementation::kMegaplan) {
    throw SpecError("--num-experts", "mixture of experts is costed as megaplan's executor runs it; Megatron-LM's (" +
                                         to_string(plan.implementation) +
                                         ") MoE layers are not modelled yet: pass --implementation megaplan");
  }
  // Its MoE layers are costed as the executor runs them: what it refuses is not costed either.
  if (std::optional<SpecError> refusal = executor_moe_refusal(model, plan)) throw *refusal;
}

PlanKernels::PlanKernels(const ModelSpec& model, const ParallelPlan& plan, int64_t tensor_parallel_rank)
    : model_(model), plan_(plan) {
  require_costed_layers(model, plan);
  if (plan.implementation == Implementation::kMegaplan) {
    const LayerRecipe recipe(model, plan);
    ring_ = recipe.ring_attention();
    blocks_ = recipe.kernel_blocks(tensor_parallel_rank, ring_);
    moe_ = recipe.moe_mlp_kernels();
  } else {
    ring_ = megatron_ring_attention(model, plan);
    blocks_ = megatron_kernel_blocks(model, plan, ring_);
  }
}

std::vector<CountedBlock> PlanKernels::stage_blocks(int64_t stage, SchedulePart part) const {
  const StageLayers layers = stage_layers(stage, model_, plan_);
  if (layers.num_layers < 1) throw std::logic_error("PlanKernels: a stage without layers");
  std::vector<CountedBlock> blocks;
  // A block `count` times; a run of one kind of layer (of one recomputation group) is one entry.
  bool run_open = false;
  const auto add = [&](KernelBlock block, int64_t count) {
    if (count <= 0 || this->block(block).empty()) return;
    if (run_open && !blocks.empty() && blocks.back().block == block) {
      blocks.back().count += count;
    } else {
      blocks.push_back({block, count});
    }
  };
  const auto add_layer = [&](KernelBlock block) {
    add(block, 1);
    run_open = true;
  };
  // Layer `l` of the stage (its index within it): an MoE layer's block or the dense one's.
  const auto moe_layer = [&](int64_t l) { return model_.moe.moe_layer(layers.first_layer + l); };
  // A stage's or recomputed group's layers (`again`: recomputed, where an MoE layer's forward adds
  // nothing to the router losses' log).
  const auto add_forward = [&](int64_t first, int64_t count, bool again) {
    run_open = false;
    for (int64_t l = first; l < first + count; ++l) {
      const bool leading = l == first;
      const KernelBlock moe_block =
          again ? (leading ? KernelBlock::kMoeLayerRecomputeFirst : KernelBlock::kMoeLayerRecompute)
                : (leading ? KernelBlock::kMoeLayerForwardFirst : KernelBlock::kMoeLayerForward);
      add_layer(moe_layer(l) ? moe_block : (leading ? KernelBlock::kLayerForwardFirst : KernelBlock::kLayerForward));
    }
    run_open = false;
  };
  if (part == SchedulePart::kForward) {
    if (layers.has_embedding) add(KernelBlock::kEmbeddingForward, 1);
    add_forward(0, layers.num_layers, false);
    add(layers.has_output_layer ? KernelBlock::kHeadForward : KernelBlock::kStageOutput, 1);
    return blocks;
  }
  if (part == SchedulePart::kBackwardWeight) {
    if (layers.has_output_layer) add(KernelBlock::kHeadWeightGradient, 1);
    for (int64_t l = layers.num_layers - 1; l >= 0; --l) {
      add_layer(moe_layer(l) ? KernelBlock::kMoeLayerWeightGradient : KernelBlock::kLayerWeightGradient);
    }
    run_open = false;
    if (layers.has_embedding) add(KernelBlock::kEmbeddingBackward, 1);
    return blocks;
  }
  const bool defer = part == SchedulePart::kBackwardInput;
  if (layers.has_output_layer) {
    add(defer ? KernelBlock::kHeadBackwardInput : KernelBlock::kHeadBackward, 1);
  } else {
    add(KernelBlock::kOutputGradientCopy, 1);
  }
  const KernelBlock layer_backward = defer ? KernelBlock::kLayerBackwardInput : KernelBlock::kLayerBackward;
  const bool selective = plan_.recompute_granularity == RecomputeGranularity::kSelective;
  const std::vector<LayerGroup> groups = recompute_groups(plan_, layers.num_layers);
  for (auto group = groups.rbegin(); group != groups.rend(); ++group) {
    if (group->recomputed) add_forward(group->first_layer, group->num_layers, true);
    for (int64_t l = group->first_layer + group->num_layers - 1; l >= group->first_layer; --l) {
      if (selective && !group->recomputed) {
        add(KernelBlock::kAttentionRecompute, 1);
        run_open = false;
      }
      add_layer(moe_layer(l) ? (defer ? KernelBlock::kMoeLayerBackwardInput : KernelBlock::kMoeLayerBackward)
                             : layer_backward);
    }
    run_open = false;
  }
  if (!layers.has_embedding) {
    add(KernelBlock::kInputGradientCopy, 1);
  } else {
    add(KernelBlock::kEmbeddingGradientDropout, 1);
    add(defer ? KernelBlock::kEmbeddingGradientCopy : KernelBlock::kEmbeddingBackward, 1);
  }
  return blocks;
}

std::vector<Kernel> PlanKernels::stage_kernels(int64_t stage, SchedulePart part) const {
  std::vector<Kernel> kernels;
  for (const CountedBlock& counted : stage_blocks(stage, part)) {
    for (int64_t i = 0; i < counted.count; ++i) {
      const std::vector<Kernel>& list = block(counted.block);
      kernels.insert(kernels.end(), list.begin(), list.end());
    }
  }
  return kernels;
}

std::vector<Kernel> optimizer_kernels(int64_t norm_elements, int64_t stepped_elements, int64_t refreshed_elements,
                                      const std::vector<int64_t>& gradient_buffer_elements,
                                      int64_t expert_norm_elements) {
  std::vector<Kernel> kernels = {flat_kernel(KernelKind::kGradientNorm, norm_elements)};
  if (expert_norm_elements > 0) kernels.push_back(flat_kernel(KernelKind::kGradientNorm, expert_norm_elements));
  kernels.push_back(flat_kernel(KernelKind::kAdamw, stepped_elements));
  if (refreshed_elements > 0) kernels.push_back(flat_kernel(KernelKind::kRefreshCompute, refreshed_elements));
  for (const int64_t elements : gradient_buffer_elements) kernels.push_back(flat_kernel(KernelKind::kFill, elements));
  return kernels;
}

std::vector<Kernel> expert_bias_kernels(const ModelSpec& model, int64_t moe_layers) {
  if (!model.moe.enabled() || !model.moe.router_enable_expert_bias) return {};
  return std::vector<Kernel>(static_cast<std::size_t>(moe_layers),
                             row_kernel(KernelKind::kMoeUpdateExpertBias, 1, model.moe.num_experts));
}

std::vector<Kernel> optimizer_step_kernels(const ParallelPlan& plan, int64_t parameters_per_gpu,
                                           int64_t expert_parameters_per_gpu) {
  const int64_t replicas = plan.gradient_group_size();
  const int64_t shard = plan.use_distributed_optimizer ? parameters_per_gpu / replicas : parameters_per_gpu;
  if (plan.implementation == Implementation::kMegaplan) {
    // The routed experts' gradients are summed and sharded over expert dp, and normed apart.
    const int64_t dense = parameters_per_gpu - expert_parameters_per_gpu;
    const int64_t stepped = plan.use_distributed_optimizer
                                ? dense / replicas + expert_parameters_per_gpu / plan.expert_data_parallel_size()
                                : parameters_per_gpu;
    // Any bucket gathered refreshes the chunk's compute copies (the experts' alone where dp x cp is 1
    // and whole experts replicate over tp).
    const bool gathered = plan.use_distributed_optimizer &&
                          (replicas > 1 || (expert_parameters_per_gpu > 0 && plan.expert_data_parallel_size() > 1));
    return optimizer_kernels(dense, stepped, gathered ? parameters_per_gpu : 0, {parameters_per_gpu},
                             expert_parameters_per_gpu);
  }
  const ImplementationOptions& options = plan.options;
  const int64_t gradient_bytes = main_gradient_bytes(options);
  std::vector<Kernel> kernels;
  // fp16 main gradients become the fp32 master weights' gradients by a copy; fp32 ones are views.
  if (gradient_bytes == 2) kernels.push_back(streaming_kernel(shard, 2 + kFp32));
  // Loss scaling: the gradients unscaled and checked for inf/NaN in one pass.
  if (options.precision == DType::kFloat16) kernels.push_back(streaming_kernel(shard, 2 * kFp32));
  kernels.push_back(flat_kernel(KernelKind::kGradientNorm, shard));
  kernels.push_back(flat_kernel(KernelKind::kAdamw, shard));
  // The fp32 master weights copied into the bf16/fp16 model weights (Megatron's Adam writes no copy).
  kernels.push_back(flat_kernel(KernelKind::kRefreshCompute, shard));
  kernels.push_back(streaming_kernel(parameters_per_gpu, gradient_bytes));  // the main-gradient buffer zeroed
  return kernels;
}

}  // namespace megaplan
