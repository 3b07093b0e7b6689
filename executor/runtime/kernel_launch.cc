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

// A rotary kernel's rotated elements per token as heads of one query group: heads of 128, else 64,
// else of 2 (every dimension rotated), so that count x dim is the kernel's cols.
struct RotaryHeads {
  int64_t count, dim;
};
RotaryHeads rotary_heads(const Kernel& kernel) {
  for (const int64_t dim : {int64_t{128}, int64_t{64}}) {
    if (kernel.cols % dim == 0) return {kernel.cols / dim, dim};
  }
  return {std::max<int64_t>(kernel.cols / 2, 1), 2};
}

}  // namespace

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

KernelLaunch::KernelLaunch(Backend& backend, const Kernel& kernel, EmbeddingTable table)
    : backend_(backend), kernel_(kernel), table_(table) {
  const Kernel& k = kernel;
  switch (k.kind) {
    case KernelKind::kGemm:
      if (k.batch > 1) throw std::invalid_argument("KernelLaunch: the executor launches no batched GEMM");
      if (k.precision == DType::kFloat16 && !backend.runs_fp16_gemms()) {
        throw std::invalid_argument("KernelLaunch: the " + backend.name() + " backend runs no fp16 GEMM");
      }
      if (k.layout == GemmLayout::kForward) {
        activation(k.m * k.k);                                              // x
        activation(k.n * k.k);                                              // W
        activation(k.n);                                                    // bias
        activation(k.m * k.n);                                              // y
        activation(k.epilogue == GemmEpilogue::kBiasGelu ? k.m * k.n : 1);  // the pre-activation
      } else if (k.layout == GemmLayout::kInputGradient) {
        activation(k.m * k.n);                                                  // dy
        activation(k.n * k.k);                                                  // W
        activation(k.m * k.k);                                                  // dx
        activation(k.epilogue == GemmEpilogue::kGeluGradient ? k.m * k.k : 1);  // the pre-activation
      } else {
        activation(k.m * k.n);  // dy
        activation(k.m * k.k);  // x
        activation(k.n * k.k);  // W
        floats(k.n * k.k);      // dW
        floats(k.n);            // db
      }
      break;
    case KernelKind::kAttentionForward:
    case KernelKind::kAttentionBackward: {
      const int64_t tokens = k.batch * k.seq * k.heads * k.head_dim;
      const int64_t fused = k.batch * k.seq * (k.heads + 2 * k.groups) * k.head_dim;
      activation(fused);   // qkv
      activation(tokens);  // out
      activation(tokens);  // dout
      activation(fused);   // dqkv
      floats(static_cast<int64_t>(
          backend.attention_saved_size(size(k.batch), size(k.seq), size(k.heads), size(k.head_dim))));
      break;
    }
    case KernelKind::kNormForward:
    case KernelKind::kNormBackward:
    case KernelKind::kRmsNormForward:
    case KernelKind::kRmsNormBackward:
      for (int i = 0; i < 4; ++i) activation(k.rows * k.cols);  // x, y (or dy, dx), residual, sum (or its gradient)
      activation(k.cols);                                       // gamma
      activation(k.cols);                                       // beta
      floats(k.rows);                                           // mean
      floats(k.rows);                                           // rstd
      floats(k.cols);                                           // dgamma
      floats(k.cols);                                           // dbeta
      break;
    case KernelKind::kAdd:
    case KernelKind::kCopy:
      for (int i = 0; i < 3; ++i) activation(k.rows);
      break;
    case KernelKind::kDropout:
      for (int i = 0; i < 3; ++i) activation(k.rows * k.cols);  // x, y, residual
      break;
    case KernelKind::kSwigluForward:
    case KernelKind::kSwigluBackward:
      activation(2 * k.rows * k.cols);  // fc1's output [gate; up] (or their gradient)
      activation(k.rows * k.cols);      // the product (or its gradient)
      activation(2 * k.rows * k.cols);  // the gradient of [gate; up]
      break;
    case KernelKind::kRotary: {
      // One query group whose heads of rotary_heads() rotate, its value head after them.
      const RotaryHeads heads = rotary_heads(k);
      activation(k.rows * (heads.count + 1) * heads.dim);
      break;
    }
    case KernelKind::kFill: floats(k.rows); break;
    case KernelKind::kEmbeddingForward:
    case KernelKind::kEmbeddingBackward:
      activation(table.vocabulary * k.cols);  // word
      activation(table.seq * k.cols);         // position
      activation(k.rows * k.cols);            // y or dy
      floats(table.vocabulary * k.cols);      // dword
      floats(table.seq * k.cols);             // dposition
      tokens_.resize(size(k.rows));
      for (std::size_t t = 0; t < tokens_.size(); ++t)
        tokens_[t] = static_cast<int64_t>((t * 7919) % size(table.vocabulary));
      break;
    case KernelKind::kCrossEntropyForward:
    case KernelKind::kCrossEntropyBackward:
      activation(k.rows * k.cols);  // logits (and their gradient, in place)
      floats(k.rows);               // lse
      floats(k.rows);               // target logit
      tokens_.resize(size(k.rows));
      for (std::size_t t = 0; t < tokens_.size(); ++t) tokens_[t] = static_cast<int64_t>((t * 7919) % size(k.cols));
      mask_.assign(size(k.rows), 1.0f);
      break;
    case KernelKind::kCrossEntropyShift:
    case KernelKind::kCrossEntropyFinish:
      for (int i = 0; i < 4; ++i) floats(k.rows);  // lse_s (the terms), peak, target logit, the lse written
      floats(2);                                   // the loss sum, a double
      mask_.assign(size(k.rows), 1.0f);
      break;
    case KernelKind::kGradientNorm:
    case KernelKind::kAdamw: tensors_ = optimizer_tensors(k.rows); break;
    case KernelKind::kRefreshCompute:
      floats(k.rows);
      activation(k.rows);
      break;
    case KernelKind::kElementwise:
      throw std::invalid_argument("KernelLaunch: the executor launches no kElementwise kernel");
  }
}

KernelLaunch::~KernelLaunch() {
  for (const auto& [copy, value] : compute_copies_) backend_.release_compute_copy(copy, value);
  for (Activation buffer : activations_) backend_.release(buffer);
  for (float* buffer : floats_) backend_.release(buffer);
}

void KernelLaunch::operator()() {
  const Kernel& k = kernel_;
  const std::vector<Activation>& a = activations_;
  const std::vector<float*>& f = floats_;
  switch (k.kind) {
    case KernelKind::kGemm:
      // The GEMM in the kernel's precision, then back to the backend's own (Megatron's fp16 GEMMs
      // are timed on a bf16 backend).
      if (k.precision == DType::kFloat16) backend_.set_gemm_precision(DType::kFloat16);
      if (k.layout == GemmLayout::kForward) {
        backend_.linear_forward(a[0], a[1], k.epilogue == GemmEpilogue::kNone ? nullptr : a[2], size(k.m), size(k.k),
                                size(k.n), k.epilogue, a[3], k.epilogue == GemmEpilogue::kBiasGelu ? a[4] : nullptr);
      } else if (k.layout == GemmLayout::kInputGradient) {
        if (k.epilogue == GemmEpilogue::kGeluGradient) {
          backend_.linear_backward_through_gelu(a[0], a[1], size(k.m), size(k.k), size(k.n), a[3], a[2]);
        } else {
          backend_.linear_backward(a[0], nullptr, a[1], size(k.m), size(k.k), size(k.n), a[2], nullptr, nullptr);
        }
      } else {
        backend_.linear_backward(a[0], a[1], a[2], size(k.m), size(k.k), size(k.n), nullptr, f[0],
                                 k.epilogue == GemmEpilogue::kBiasGradient ? f[1] : nullptr);
      }
      if (k.precision == DType::kFloat16 && backend_.activation_type() != DType::kFloat16) {
        backend_.set_gemm_precision(DType::kBFloat16);
      }
      break;
    case KernelKind::kAttentionForward:
      backend_.attention_forward(a[0], size(k.batch), size(k.seq), size(k.heads), size(k.groups), size(k.head_dim),
                                 timed_dropout(k.dropout, k.seq), a[1], f[0]);
      break;
    case KernelKind::kAttentionBackward:
      backend_.attention_backward(a[2], a[0], a[1], f[0], size(k.batch), size(k.seq), size(k.heads), size(k.groups),
                                  size(k.head_dim), timed_dropout(k.dropout, k.seq), a[3]);
      break;
    case KernelKind::kNormForward:
      backend_.layernorm_forward(a[0], k.fused_residual ? a[2] : nullptr, timed_dropout(k.dropout, k.rows),
                                 k.fused_residual ? a[3] : nullptr, a[4], a[5], size(k.rows), size(k.cols), a[1], f[0],
                                 f[1]);
      break;
    case KernelKind::kNormBackward:
      backend_.layernorm_backward(a[0], a[2], a[4], f[0], f[1], size(k.rows), size(k.cols),
                                  k.fused_residual ? a[3] : nullptr, a[1], f[2], f[3]);
      break;
    case KernelKind::kRmsNormForward:
      backend_.rmsnorm_forward(a[0], k.fused_residual ? a[2] : nullptr, timed_dropout(k.dropout, k.rows),
                               k.fused_residual ? a[3] : nullptr, a[4], size(k.rows), size(k.cols), 1e-5f, a[1], f[1]);
      break;
    case KernelKind::kRmsNormBackward:
      backend_.rmsnorm_backward(a[0], a[2], a[4], f[1], size(k.rows), size(k.cols), k.fused_residual ? a[3] : nullptr,
                                a[1], f[2]);
      break;
    case KernelKind::kSwigluForward: backend_.swiglu_forward(a[0], size(k.rows), size(k.cols), a[1]); break;
    case KernelKind::kSwigluBackward: backend_.swiglu_backward(a[1], a[0], size(k.rows), size(k.cols), a[2]); break;
    case KernelKind::kRotary: {
      const RotaryHeads heads = rotary_heads(k);
      backend_.rotary(a[0], 1, size(k.rows), 1, size(heads.count - 1), size(heads.dim), size(heads.dim), 10000.0f,
                      false);
      break;
    }
    case KernelKind::kAdd: backend_.add(a[0], a[1], size(k.rows), a[2]); break;
    case KernelKind::kCopy: backend_.copy(a[0], size(k.rows), a[2]); break;
    case KernelKind::kDropout:
      backend_.dropout(a[0], k.fused_residual ? a[2] : nullptr, size(k.rows), size(k.cols), timed_dropout(true, k.rows),
                       a[1]);
      break;
    case KernelKind::kFill: backend_.fill(f[0], size(k.rows), 0.0f); break;
    case KernelKind::kEmbeddingForward:
      backend_.embedding_forward(tokens_.data(), size(k.rows), size(table_.seq), a[0], 0, size(table_.vocabulary), a[1],
                                 size(k.cols), a[2]);
      break;
    case KernelKind::kEmbeddingBackward:
      backend_.embedding_backward(a[2], tokens_.data(), size(k.rows), size(table_.seq), size(k.cols), 0,
                                  size(table_.vocabulary), f[0], f[1]);
      break;
    case KernelKind::kCrossEntropyForward:
      backend_.cross_entropy_statistics(a[0], tokens_.data(), size(k.rows), size(k.cols), 0, f[0], f[1], nullptr);
      break;
    case KernelKind::kCrossEntropyBackward:
      backend_.cross_entropy_backward(a[0], f[0], tokens_.data(), mask_.data(), size(k.rows), size(k.cols), 0, 1.0f,
                                      a[0]);
      break;
    case KernelKind::kCrossEntropyShift: backend_.cross_entropy_shift(f[1], size(k.rows), f[0]); break;
    case KernelKind::kCrossEntropyFinish:
      backend_.cross_entropy_finish(f[1], f[0], f[2], mask_.data(), size(k.rows), f[3],
                                    reinterpret_cast<double*>(f[4]));
      break;
    case KernelKind::kGradientNorm: (void)backend_.gradient_sum_of_squares(tensors_); break;
    case KernelKind::kAdamw: backend_.adamw_step(tensors_, {1, 1e-4, 0.9, 0.95, 1e-8, 1.0}); break;
    case KernelKind::kRefreshCompute: backend_.refresh_compute_copy(f[0], size(k.rows), a[0]); break;
    case KernelKind::kElementwise: break;
  }
}

}  // namespace megaplan::exec
