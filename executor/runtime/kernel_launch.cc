// Each kernel kind's Backend call, with the arguments executor/model/stage_chunk.cc passes.
#include "executor/runtime/kernel_launch.h"

#include <algorithm>
#include <random>
#include <stdexcept>

namespace megaplan::exec {

namespace {

// AdamW and the gradient norm run over a model's parameter list, not one flat tensor: this many pieces.
constexpr int64_t kOptimizerTensors = 64;

std::size_t size(int64_t n) { return static_cast<std::size_t>(n); }

// A kernel's dropout as training draws it (inactive where the kernel has none), over sequences of
// `seq` tokens, at Megatron's default rate: a draw costs the same whichever elements it keeps.
DropoutMask timed_dropout(bool dropout, int64_t seq) {
  DropoutMask mask;
  if (!dropout) return mask;
  mask.probability = 0.1f;
  mask.seq = std::max<int64_t>(seq, 1);
  return mask;
}

// Values uniform in [-1, 1): what every activation buffer starts with (tiled).
const std::vector<float>& random_tile() {
  static const std::vector<float> tile = [] {
    std::mt19937 generator(7);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::vector<float> values(std::size_t{1} << 16);
    for (float& v : values) v = uniform(generator);
    return values;
  }();
  return tile;
}

// The head dimension a width of per-token elements is taken to hold: heads of 128, else of 64, else
// of 2.
int64_t head_dim_of(int64_t width) {
  for (const int64_t dim : {int64_t{128}, int64_t{64}}) {
    if (width % dim == 0) return dim;
  }
  return 2;
}

// A rotary kernel's rotated elements per token as heads of one query group (every dimension
// rotated), so that count x dim is the kernel's cols.
struct RotaryHeads {
  int64_t count, dim;
};
RotaryHeads rotary_heads(const Kernel& kernel) {
  const int64_t dim = head_dim_of(kernel.cols);
  return {std::max<int64_t>(kernel.cols / dim, 1), dim};
}

}  // namespace

// A ring block runs over a rank's two chunks of `seq` tokens each (kernel.seq is one chunk); a
// packing kernel over `rows` tokens of one query head per key-value head.
AttentionDims KernelLaunch::ring_dims() const {
  const Kernel& k = kernel_;
  if (k.kind == KernelKind::kAttentionBlockForward || k.kind == KernelKind::kAttentionBlockBackward) {
    return {size(k.batch), size(2 * k.seq), size(k.heads), size(k.groups), size(k.head_dim)};
  }
  const int64_t dim = head_dim_of(k.cols / 2);  // cols: the key-value width twice
  const int64_t groups = std::max<int64_t>(k.cols / 2 / dim, 1);
  return {1, size(k.rows), size(groups), size(groups), size(dim)};
}

// A diagonal block: the first query chunk against the first key chunk, at the same place; an
// unmasked one: the second query chunk, placed after the first key chunk.
AttentionChunkBlock KernelLaunch::ring_block() const {
  const int64_t chunk = kernel_.seq;
  return kernel_.diagonal ? AttentionChunkBlock{0, 0, 0, 0} : AttentionChunkBlock{1, 0, chunk, 0};
}

// Operands hold varied values, not the allocator's zeros: a GEMM multiplying zeros toggles few bits
// and draws a fraction of a trained step's power, so it ran at clocks a step at the power limit does
// not reach; and a division or square root of zero takes the GPU's slow path (AdamW).
Activation KernelLaunch::activation(int64_t elements) {
  const auto n = std::max<int64_t>(elements, 1);
  Activation x = backend_.allocate_activation(size(n));
  activations_.push_back(x);
  const std::vector<float>& tile = random_tile();
  const auto bytes = static_cast<int64_t>(backend_.activation_bytes());
  const auto at = [&](int64_t element) {
    return reinterpret_cast<Activation>(reinterpret_cast<unsigned char*>(x) + element * bytes);
  };
  int64_t filled = std::min<int64_t>(n, static_cast<int64_t>(tile.size()));
  backend_.upload(x, tile.data(), size(filled));
  while (filled < n) {  // doubling copies of what is there
    const int64_t count = std::min(filled, n - filled);
    backend_.copy(x, size(count), at(filled));
    filled += count;
  }
  return x;
}

float* KernelLaunch::floats(int64_t elements) {
  floats_.push_back(backend_.allocate(size(std::max<int64_t>(elements, 1))));
  return floats_.back();
}

std::vector<OptimizerTensor> KernelLaunch::optimizer_tensors(int64_t elements) {
  float* value = floats(elements);
  float* gradient = floats(elements);
  float* first = floats(elements);
  float* second = floats(elements);
  // Values a training step sees: normal numbers, the second moment positive.
  backend_.fill(value, size(elements), 0.01f);
  backend_.fill(gradient, size(elements), 1e-3f);
  backend_.fill(first, size(elements), 1e-4f);
  backend_.fill(second, size(elements), 1e-8f);
  std::vector<OptimizerTensor> tensors;
  const int64_t piece = (elements + kOptimizerTensors - 1) / kOptimizerTensors;
  for (int64_t offset = 0; offset < elements; offset += piece) {
    const int64_t n = std::min(piece, elements - offset);
    // Each piece is a parameter with its own compute copy, as the model's are.
    Activation compute = backend_.compute_copy(value + offset, size(n));
    compute_copies_.emplace_back(compute, value + offset);
    tensors.push_back({value + offset, gradient + offset, first + offset, second + offset, compute, size(n), 0.01});
  }
  return tensors;
}

int32_t* KernelLaunch::indices(int64_t elements) {
  indices_.push_back(backend_.allocate_indices(size(std::max<int64_t>(elements, 1))));
  return indices_.back();
}

void KernelLaunch::route(int64_t tokens, int64_t experts, int64_t topk, int64_t rows) {
  router_.experts = size(experts);
  router_.topk = size(topk);
  logits_ = activation(tokens * experts);
  experts_ = indices(tokens * topk);
  probs_ = floats(tokens * topk);
  maps_ = {indices(tokens * topk), indices(std::max(rows, tokens * topk))};
  backend_.moe_top_k(logits_, size(tokens), router_, nullptr, experts_, probs_);
  (void)backend_.moe_dispatch(experts_, probs_, size(tokens), router_, {}, maps_);
}

KernelLaunch::KernelLaunch(Backend& backend, const Kernel& kernel, EmbeddingTable table)
    : backend_(backend), kernel_(kernel), table_(table) {
  const Kernel& k = kernel;
  Buffers& b = buffers_;
  switch (k.kind) {
    case KernelKind::kGemm:
      if (k.batch > 1) throw std::invalid_argument("KernelLaunch: the executor launches no batched GEMM");
      if (k.precision == DType::kFloat16 && !backend.runs_fp16_gemms()) {
        throw std::invalid_argument("KernelLaunch: the " + backend.name() + " backend runs no fp16 GEMM");
      }
      if (k.layout == GemmLayout::kForward) {
        b.x = activation(k.m * k.k);
        b.weight = activation(k.n * k.k);
        b.bias = activation(k.n);
        b.y = activation(k.m * k.n);
        b.pre_activation = activation(k.epilogue == GemmEpilogue::kBiasGelu ? k.m * k.n : 1);
      } else if (k.layout == GemmLayout::kInputGradient) {
        b.dy = activation(k.m * k.n);
        b.weight = activation(k.n * k.k);
        b.dx = activation(k.m * k.k);
        b.pre_activation = activation(k.epilogue == GemmEpilogue::kGeluGradient ? k.m * k.k : 1);
      } else {
        b.dy = activation(k.m * k.n);
        b.x = activation(k.m * k.k);
        b.weight = activation(k.n * k.k);
        b.weight_gradient = floats(k.n * k.k);
        b.bias_gradient = floats(k.n);
      }
      break;
    case KernelKind::kAttentionForward:
    case KernelKind::kAttentionBackward: {
      const int64_t tokens = k.batch * k.seq * k.heads * k.head_dim;
      const int64_t fused = k.batch * k.seq * (k.heads + 2 * k.groups) * k.head_dim;
      b.qkv = activation(fused);
      b.y = activation(tokens);
      b.dy = activation(tokens);
      b.dx = activation(fused);
      b.saved = floats(static_cast<int64_t>(
          backend.attention_saved_size(size(k.batch), size(k.seq), size(k.heads), size(k.head_dim))));
      break;
    }
    case KernelKind::kAttentionBlockForward:
    case KernelKind::kAttentionBlockBackward:
    case KernelKind::kPackKeyValues:
    case KernelKind::kUnpackKeyValueGradients: {
      const AttentionDims d = ring_dims();
      const auto tokens = static_cast<int64_t>(d.batch * d.seq);
      const auto queries = tokens * static_cast<int64_t>(d.heads * d.dim);
      const auto key_values = tokens * static_cast<int64_t>(2 * d.groups * d.dim);
      b.qkv = activation(queries + key_values);
      b.key_values = activation(key_values);
      b.key_value_gradients = activation(key_values);
      b.dx = activation(queries + key_values);  // dqkv
      if (k.kind == KernelKind::kAttentionBlockForward || k.kind == KernelKind::kAttentionBlockBackward) {
        b.y = activation(queries);   // the merged output, in the compute type
        b.dy = activation(queries);  // its gradient
        b.merged = floats(queries);  // the running output (fp32)
        b.lse = floats(tokens * static_cast<int64_t>(d.heads));
        // Each row's log-sum-exp as a merge meets it: finite, above the scores' exponents, so
        // that the backward's probabilities stay normal numbers.
        backend.fill(b.lse, size(tokens * static_cast<int64_t>(d.heads)), 8.0f);
        backend.fill(b.merged, size(queries), 0.0f);
      }
      break;
    }
    case KernelKind::kNormForward:
    case KernelKind::kNormBackward:
    case KernelKind::kRmsNormForward:
    case KernelKind::kRmsNormBackward: {
      // Forward: x, y, the branch added first and the sum written. Backward: dy, dx, x and the
      // residual stream's gradient.
      const bool forward = k.kind == KernelKind::kNormForward || k.kind == KernelKind::kRmsNormForward;
      (forward ? b.x : b.dy) = activation(k.rows * k.cols);
      (forward ? b.y : b.dx) = activation(k.rows * k.cols);
      (forward ? b.branch : b.x) = activation(k.rows * k.cols);
      (forward ? b.sum : b.residual_gradient) = activation(k.rows * k.cols);
      b.gamma = activation(k.cols);
      b.beta = activation(k.cols);
      b.mean = floats(k.rows);
      b.rstd = floats(k.rows);
      b.weight_gradient = floats(k.cols);  // dgamma
      b.bias_gradient = floats(k.cols);    // dbeta
      break;
    }
    case KernelKind::kHeadRmsNormForward:
    case KernelKind::kHeadRmsNormBackward:
      // The fused qkv in and out (or dy and dx, in place as the executor runs it); the query and
      // key norms' weights in gamma and beta, their gradients in the weight's and the bias's.
      b.qkv = activation(k.rows * k.cols);
      b.y = activation(k.rows * k.cols);
      b.rstd = floats(k.rows * k.cols / k.head_dim);
      b.gamma = activation(k.head_dim);
      b.beta = activation(k.head_dim);
      b.weight_gradient = floats(k.head_dim);
      b.bias_gradient = floats(k.head_dim);
      break;
    case KernelKind::kAdd:
    case KernelKind::kCopy:
      b.x = activation(k.rows);
      b.branch = activation(k.rows);
      b.y = activation(k.rows);
      break;
    case KernelKind::kDropout:
      b.x = activation(k.rows * k.cols);
      b.y = activation(k.rows * k.cols);
      b.branch = activation(k.rows * k.cols);  // the residual a fused dropout adds
      break;
    case KernelKind::kSwigluForward:
    case KernelKind::kSwigluBackward:
      b.x = activation(2 * k.rows * k.cols);   // fc1's output [gate; up]
      b.y = activation(k.rows * k.cols);       // the product (or its gradient)
      b.dx = activation(2 * k.rows * k.cols);  // the gradient of [gate; up]
      break;
    case KernelKind::kRotary: {
      // One query group whose heads of rotary_heads() rotate, its value head after them.
      const RotaryHeads heads = rotary_heads(k);
      b.qkv = activation(k.rows * (heads.count + 1) * heads.dim);
      break;
    }
    case KernelKind::kFill: b.master = floats(k.rows); break;
    case KernelKind::kZero: b.y = activation(k.rows); break;
    case KernelKind::kConvert:
      b.master = floats(k.rows);
      b.y = activation(k.rows);
      break;
    case KernelKind::kEmbeddingForward:
    case KernelKind::kEmbeddingBackward:
      b.weight = activation(table.vocabulary * k.cols);  // the word embedding
      b.position = activation(table.seq * k.cols);
      b.y = activation(k.rows * k.cols);  // y, or dy
      b.weight_gradient = floats(table.vocabulary * k.cols);
      b.position_gradient = floats(table.seq * k.cols);
      tokens_.resize(size(k.rows));
      for (std::size_t t = 0; t < tokens_.size(); ++t)
        tokens_[t] = static_cast<int64_t>((t * 7919) % size(table.vocabulary));
      break;
    case KernelKind::kCrossEntropyForward:
    case KernelKind::kCrossEntropyBackward:
      b.y = activation(k.rows * k.cols);  // the logits (and their gradient, in place)
      b.lse = floats(k.rows);
      b.target = floats(k.rows);
      tokens_.resize(size(k.rows));
      for (std::size_t t = 0; t < tokens_.size(); ++t) tokens_[t] = static_cast<int64_t>((t * 7919) % size(k.cols));
      loss_weights_.assign(size(k.rows), 1.0f);
      break;
    case KernelKind::kCrossEntropyShift:
    case KernelKind::kCrossEntropyFinish:
      b.terms = floats(k.rows);  // each row's lse_s, the shard's term
      b.peak = floats(k.rows);
      b.target = floats(k.rows);
      b.lse = floats(k.rows);
      b.loss_sum = floats(2);  // a double
      loss_weights_.assign(size(k.rows), 1.0f);
      break;
    case KernelKind::kGradientNorm:
    case KernelKind::kAdamw: tensors_ = optimizer_tensors(k.rows); break;
    case KernelKind::kRefreshCompute:
      b.master = floats(k.rows);
      b.y = activation(k.rows);
      break;
    case KernelKind::kElementwise:
      throw std::invalid_argument("KernelLaunch: the executor launches no kElementwise kernel");
    // Mixture of experts: router kernels over the kernel's experts; row moves over a routing of
    // their own (the work is the rows moved, whatever the experts: eight, or 2k for a larger k).
    case KernelKind::kMoeTopK:
    case KernelKind::kMoeTopKBackward:
    case KernelKind::kMoeDispatch:
    case KernelKind::kMoeAuxCounts:
    case KernelKind::kMoeSwitchLoss:
    case KernelKind::kMoeSwitchLossGradient:
    case KernelKind::kMoeSequenceAuxLoss:
    case KernelKind::kMoeSequenceAuxLossGradient:
    case KernelKind::kMoeZLoss:
    case KernelKind::kMoeZLossGradient:
      route(k.rows, k.cols, std::max<int64_t>(k.batch, 1), 0);
      b.master = floats(k.rows * k.cols);  // the logits' gradient
      b.terms = floats(k.cols);            // the aux loss's counts
      backend_.fill(b.terms, size(k.cols), static_cast<float>(k.rows * std::max<int64_t>(k.batch, 1) / k.cols));
      b.loss_sum = floats(2);  // a double
      break;
    case KernelKind::kMoePermute: {  // rows gathered from as many token rows, spread
      b.x = activation(k.rows * k.cols);
      b.y = activation(k.rows * k.cols);
      int32_t* row_tokens = indices(k.rows);
      std::vector<int32_t> tokens(size(k.rows));
      for (std::size_t r = 0; r < tokens.size(); ++r) tokens[r] = static_cast<int32_t>((r * 7919) % tokens.size());
      backend_.upload(reinterpret_cast<float*>(row_tokens), reinterpret_cast<const float*>(tokens.data()),
                      tokens.size());
      maps_.row_tokens = row_tokens;
      break;
    }
    case KernelKind::kMoePermuteBackward:
    case KernelKind::kMoeCombine:
    case KernelKind::kMoeCombineBackward: {
      // The dispatch's rows: every route's, or as combine's backward states them (padded beyond).
      const int64_t rows = std::max(k.m, k.rows * k.batch);
      route(k.rows, std::max<int64_t>(8, 2 * k.batch), k.batch, rows);
      b.x = activation(rows * k.cols);
      b.dx = activation(rows * k.cols);
      b.y = activation(k.rows * k.cols);  // the tokens
      b.dy = activation(k.rows * k.cols);
      b.master = floats(k.rows * k.batch);  // the probabilities' gradient
      break;
    }
    case KernelKind::kSigmoidGatedAdd:
    case KernelKind::kSigmoidGatedAddBackward:
      b.x = activation(k.rows * k.cols);
      b.y = activation(k.rows * k.cols);
      b.dx = activation(k.rows * k.cols);
      b.dy = activation(k.rows * k.cols);
      b.branch = activation(k.rows);  // the gate's logit per row
      b.master = floats(k.rows);
      break;
    case KernelKind::kMoeUpdateExpertBias: {  // counts uneven across the experts, as a run's are
      b.terms = floats(k.cols);
      std::vector<float> counts(size(k.cols));
      for (std::size_t e = 0; e < counts.size(); ++e) counts[e] = static_cast<float>((e * 7919) % 1000);
      backend_.upload(b.terms, counts.data(), counts.size());
      b.master = floats(k.cols);  // the bias
      break;
    }
  }
}

KernelLaunch::~KernelLaunch() {
  for (const auto& [copy, value] : compute_copies_) backend_.release_compute_copy(copy, value);
  for (Activation buffer : activations_) backend_.release(buffer);
  for (float* buffer : floats_) backend_.release(buffer);
  for (int32_t* buffer : indices_) backend_.release(buffer);
}

void KernelLaunch::operator()() {
  const Kernel& k = kernel_;
  const Buffers& b = buffers_;
  // A router loss's value is summed (a double), its gradient added into the logits'.
  const bool loss_gradient = k.kind == KernelKind::kMoeSwitchLossGradient ||
                             k.kind == KernelKind::kMoeSequenceAuxLossGradient ||
                             k.kind == KernelKind::kMoeZLossGradient;
  double* const loss_sum = loss_gradient ? nullptr : reinterpret_cast<double*>(b.loss_sum);
  float* const d_logits = loss_gradient ? b.master : nullptr;
  switch (k.kind) {
    case KernelKind::kGemm:
      // The GEMM in the kernel's precision, then back to the backend's own (Megatron's fp16 GEMMs
      // are timed on a bf16 backend).
      if (k.precision == DType::kFloat16) backend_.set_gemm_precision(DType::kFloat16);
      if (k.layout == GemmLayout::kForward) {
        backend_.linear_forward(b.x, b.weight, k.epilogue == GemmEpilogue::kNone ? nullptr : b.bias, size(k.m),
                                size(k.k), size(k.n), k.epilogue, b.y,
                                k.epilogue == GemmEpilogue::kBiasGelu ? b.pre_activation : nullptr);
      } else if (k.layout == GemmLayout::kInputGradient) {
        if (k.epilogue == GemmEpilogue::kGeluGradient) {
          backend_.linear_backward_through_gelu(b.dy, b.weight, size(k.m), size(k.k), size(k.n), b.pre_activation,
                                                b.dx);
        } else {
          backend_.linear_backward(b.dy, nullptr, b.weight, size(k.m), size(k.k), size(k.n), b.dx, nullptr, nullptr);
        }
      } else {
        backend_.linear_backward(b.dy, b.x, b.weight, size(k.m), size(k.k), size(k.n), nullptr, b.weight_gradient,
                                 k.epilogue == GemmEpilogue::kBiasGradient ? b.bias_gradient : nullptr);
      }
      if (k.precision == DType::kFloat16 && backend_.activation_type() != DType::kFloat16) {
        backend_.set_gemm_precision(DType::kBFloat16);
      }
      break;
    case KernelKind::kAttentionForward:
      backend_.attention_forward(b.qkv, size(k.batch), size(k.seq), size(k.heads), size(k.groups), size(k.head_dim),
                                 timed_dropout(k.dropout, k.seq), b.y, b.saved);
      break;
    case KernelKind::kAttentionBackward:
      backend_.attention_backward(b.dy, b.qkv, b.y, b.saved, size(k.batch), size(k.seq), size(k.heads), size(k.groups),
                                  size(k.head_dim), timed_dropout(k.dropout, k.seq), b.dx);
      break;
    // A block's mask covers the two chunks its tokens are placed in (ring_block).
    case KernelKind::kAttentionBlockForward:
      backend_.attention_block_forward(b.qkv, b.key_values, ring_dims(), ring_block(),
                                       timed_dropout(k.dropout, 2 * k.seq), b.merged, b.lse);
      break;
    case KernelKind::kAttentionBlockBackward:
      backend_.attention_block_backward(b.dy, b.qkv, b.y, b.lse, b.key_values, ring_dims(), ring_block(),
                                        timed_dropout(k.dropout, 2 * k.seq), b.dx, b.key_value_gradients);
      break;
    case KernelKind::kPackKeyValues: backend_.pack_key_values(b.qkv, ring_dims(), b.key_values); break;
    case KernelKind::kUnpackKeyValueGradients:
      backend_.unpack_key_value_gradients(b.key_value_gradients, ring_dims(), b.dx);
      break;
    case KernelKind::kZero: backend_.zero(b.y, size(k.rows)); break;
    case KernelKind::kConvert: backend_.convert(b.master, size(k.rows), b.y); break;
    case KernelKind::kNormForward:
      backend_.layernorm_forward(b.x, k.fused_residual ? b.branch : nullptr, timed_dropout(k.dropout, k.rows),
                                 k.fused_residual ? b.sum : nullptr, b.gamma, b.beta, size(k.rows), size(k.cols), b.y,
                                 b.mean, b.rstd);
      break;
    case KernelKind::kNormBackward:
      backend_.layernorm_backward(b.dy, b.x, b.gamma, b.mean, b.rstd, size(k.rows), size(k.cols),
                                  k.fused_residual ? b.residual_gradient : nullptr, b.dx, b.weight_gradient,
                                  b.bias_gradient);
      break;
    case KernelKind::kRmsNormForward:
      backend_.rmsnorm_forward(b.x, k.fused_residual ? b.branch : nullptr, timed_dropout(k.dropout, k.rows),
                               k.fused_residual ? b.sum : nullptr, b.gamma, size(k.rows), size(k.cols), 1e-5f, b.y,
                               b.rstd);
      break;
    case KernelKind::kRmsNormBackward:
      backend_.rmsnorm_backward(b.dy, b.x, b.gamma, b.rstd, size(k.rows), size(k.cols),
                                k.fused_residual ? b.residual_gradient : nullptr, b.dx, b.weight_gradient);
      break;
    case KernelKind::kHeadRmsNormForward:
      backend_.head_rmsnorm_forward(b.qkv, b.gamma, b.beta, size(k.rows), size(k.groups), size(k.heads / k.groups),
                                    size(k.head_dim), 1e-6f, b.y, b.rstd);
      break;
    case KernelKind::kHeadRmsNormBackward:
      backend_.head_rmsnorm_backward(b.y, b.qkv, b.gamma, b.beta, b.rstd, size(k.rows), size(k.groups),
                                     size(k.heads / k.groups), size(k.head_dim), b.y, b.weight_gradient,
                                     b.bias_gradient);
      break;
    case KernelKind::kSwigluForward: backend_.swiglu_forward(b.x, size(k.rows), size(k.cols), b.y); break;
    case KernelKind::kSwigluBackward: backend_.swiglu_backward(b.y, b.x, size(k.rows), size(k.cols), b.dx); break;
    case KernelKind::kRotary: {
      const RotaryHeads heads = rotary_heads(k);
      backend_.rotary(b.qkv, 1, size(k.rows), 1, size(heads.count - 1), size(heads.dim), size(heads.dim), 10000.0f,
                      false, {});
      break;
    }
    case KernelKind::kAdd: backend_.add(b.x, b.branch, size(k.rows), b.y); break;
    case KernelKind::kCopy: backend_.copy(b.x, size(k.rows), b.y); break;
    case KernelKind::kDropout:
      backend_.dropout(b.x, k.fused_residual ? b.branch : nullptr, size(k.rows), size(k.cols),
                       timed_dropout(true, k.rows), b.y);
      break;
    case KernelKind::kFill: backend_.fill(b.master, size(k.rows), 0.0f); break;
    case KernelKind::kEmbeddingForward:
      backend_.embedding_forward(tokens_.data(), size(k.rows), size(table_.seq), b.weight, 0, size(table_.vocabulary),
                                 b.position, size(k.cols), b.y, {});
      break;
    case KernelKind::kEmbeddingBackward:
      backend_.embedding_backward(b.y, tokens_.data(), size(k.rows), size(table_.seq), size(k.cols), 0,
                                  size(table_.vocabulary), b.weight_gradient, b.position_gradient, {});
      break;
    case KernelKind::kCrossEntropyForward:
      backend_.cross_entropy_statistics(b.y, tokens_.data(), size(k.rows), size(k.cols), 0, b.lse, b.target, nullptr);
      break;
    case KernelKind::kCrossEntropyBackward:
      backend_.cross_entropy_backward(b.y, b.lse, tokens_.data(), loss_weights_.data(), size(k.rows), size(k.cols), 0,
                                      1.0f, b.y);
      break;
    case KernelKind::kCrossEntropyShift: backend_.cross_entropy_shift(b.peak, size(k.rows), b.terms); break;
    case KernelKind::kCrossEntropyFinish:
      backend_.cross_entropy_finish(b.peak, b.terms, b.target, loss_weights_.data(), size(k.rows), b.lse,
                                    reinterpret_cast<double*>(b.loss_sum));
      break;
    case KernelKind::kGradientNorm: (void)backend_.gradient_sum_of_squares(tensors_); break;
    case KernelKind::kAdamw: backend_.adamw_step(tensors_, {1, 1e-4, 0.9, 0.95, 1e-8, 1.0}); break;
    case KernelKind::kRefreshCompute: backend_.refresh_compute_copy(b.master, size(k.rows), b.y); break;
    case KernelKind::kElementwise: break;
    case KernelKind::kMoeTopK: backend_.moe_top_k(logits_, size(k.rows), router_, nullptr, experts_, probs_); break;
    case KernelKind::kMoeTopKBackward:
      backend_.moe_top_k_backward(logits_, size(k.rows), router_, experts_, probs_, b.master);
      break;
    case KernelKind::kMoeDispatch:
      (void)backend_.moe_dispatch(experts_, probs_, size(k.rows), router_, {}, maps_);
      break;
    case KernelKind::kMoePermute: backend_.moe_permute(b.x, size(k.cols), maps_.row_tokens, size(k.rows), b.y); break;
    case KernelKind::kMoePermuteBackward:
      backend_.moe_permute_backward(b.dx, size(k.cols), maps_.token_rows, size(k.rows), size(k.batch), b.dy);
      break;
    case KernelKind::kMoeCombine:
      backend_.moe_combine(b.x, size(k.cols), maps_.token_rows, probs_, size(k.rows), size(k.batch), b.y);
      break;
    case KernelKind::kMoeCombineBackward:
      backend_.moe_combine_backward(b.dy, b.x, size(k.cols), {maps_.token_rows, maps_.row_tokens}, probs_, size(k.rows),
                                    size(k.batch), size(k.m), b.dx, b.master);
      break;
    case KernelKind::kMoeAuxCounts: backend_.moe_aux_loss_counts(logits_, size(k.rows), router_, b.terms); break;
    case KernelKind::kMoeSwitchLoss:
    case KernelKind::kMoeSwitchLossGradient:
      backend_.moe_switch_loss(logits_, size(k.rows), router_, b.terms, size(k.rows), 1.0, loss_sum, d_logits, 1.0f);
      break;
    case KernelKind::kMoeSequenceAuxLoss:
    case KernelKind::kMoeSequenceAuxLossGradient:
      backend_.moe_sequence_aux_loss(logits_, size(k.rows), size(k.m), router_, 1.0, loss_sum, d_logits, 1.0f);
      break;
    case KernelKind::kMoeZLoss:
    case KernelKind::kMoeZLossGradient:
      backend_.moe_z_loss(logits_, size(k.rows), size(k.cols), 1.0, loss_sum, d_logits, 1.0f);
      break;
    case KernelKind::kSigmoidGatedAdd:
      backend_.sigmoid_gated_add(b.x, b.branch, size(k.rows), size(k.cols), b.y);
      break;
    case KernelKind::kSigmoidGatedAddBackward:
      backend_.sigmoid_gated_add_backward(b.dy, b.x, b.branch, size(k.rows), size(k.cols), b.dx, b.master);
      break;
    case KernelKind::kMoeUpdateExpertBias:
      backend_.moe_update_expert_bias(b.terms, size(k.cols), 1e-3f, b.master);
      break;
  }
}

}  // namespace megaplan::exec
