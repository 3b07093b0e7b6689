// One kernel of core's kernel list (core/kernel_list.h) launched on a Backend as the executor's
// model launches it: the same Backend call, the same shapes, the same epilogue, on buffers of its
// own. The profiler times kernels through it; a test records its launches and gets the kernel back.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/kernel_list.h"
#include "executor/runtime/backend.h"

namespace megaplan::exec {

// What an embedding kernel reads beside its shape: the vocabulary rows it looks tokens up in and
// the sequence length positions repeat over (GPT-2's padded vocabulary and context by default).
struct EmbeddingTable {
  int64_t vocabulary = 50304;
  int64_t seq = 1024;
};

class KernelLaunch {
 public:
  // Allocates the kernel's buffers (zeroed; tokens and targets spread over the vocabulary).
  // Throws std::invalid_argument for a kernel the executor does not launch (kElementwise, batched
  // GEMMs) and for an fp16 GEMM on a backend without them (Backend::runs_fp16_gemms; Megatron's
  // fp16 GEMMs run on the executor's GEMM calls with fp16 operands, for the profiler).
  KernelLaunch(Backend& backend, const Kernel& kernel, EmbeddingTable table = {});
  ~KernelLaunch();
  KernelLaunch(const KernelLaunch&) = delete;
  KernelLaunch& operator=(const KernelLaunch&) = delete;

  void operator()();

 private:
  Activation activation(int64_t elements);
  float* floats(int64_t elements);
  std::vector<OptimizerTensor> optimizer_tensors(int64_t elements);

  // The launch's buffers by their role in its Backend call; null where the kernel has none. x and
  // y: a kernel's input and output (a GEMM's, a norm's, [gate; up] and SwiGLU's product, the
  // logits, the embedding's output); dy and dx their gradients; branch: what a fused norm, add or
  // dropout adds (sum: the sum it writes); weight: a GEMM's or the word embedding's.
  struct Buffers {
    Activation x = nullptr, y = nullptr, dy = nullptr, dx = nullptr, weight = nullptr, bias = nullptr,
               pre_activation = nullptr, branch = nullptr, sum = nullptr, residual_gradient = nullptr, gamma = nullptr,
               beta = nullptr, qkv = nullptr, position = nullptr, key_values = nullptr, key_value_gradients = nullptr;
    float *weight_gradient = nullptr, *bias_gradient = nullptr, *position_gradient = nullptr, *mean = nullptr,
          *rstd = nullptr, *saved = nullptr, *lse = nullptr, *target = nullptr, *peak = nullptr, *terms = nullptr,
          *loss_sum = nullptr, *master = nullptr, *merged = nullptr;
  };
  // A ring block's or a key-value packing's shapes (kernel_launch.cc).
  AttentionDims ring_dims() const;
  AttentionChunkBlock ring_block() const;
  // An MoE kernel's routing: `tokens` tokens routed by the backend's own top k over `experts`
  // (random logits) and dispatched dropless, into router_, logits_, experts_, probs_ and maps_
  // (whose row map holds at least `rows` rows).
  void route(int64_t tokens, int64_t experts, int64_t topk, int64_t rows);
  int32_t* indices(int64_t elements);

  Backend& backend_;
  Kernel kernel_;
  EmbeddingTable table_;
  Buffers buffers_;
  std::vector<Activation> activations_;  // every buffer, to release
  std::vector<float*> floats_;
  std::vector<int64_t> tokens_;
  std::vector<float> loss_weights_;
  std::vector<OptimizerTensor> tensors_;
  std::vector<std::pair<Activation, float*>> compute_copies_;
  std::vector<int32_t*> indices_;
  MoeRouter router_;
  Activation logits_ = nullptr;
  int32_t* experts_ = nullptr;
  float* probs_ = nullptr;
  MoeDispatchMaps maps_;
};

}  // namespace megaplan::exec
