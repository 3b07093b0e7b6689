// Megatron-Core's MoE layer on one rank, the CPU reference (issue 40): the router's logits x·Wrᵀ,
// the top-k routing and dispatch of moe_router.h, each expert a SwiGLU MLP over its rows (fc1
// [2·ffn x hidden], the gate's rows then the up projection's, as Megatron fuses them; fc2
// [hidden x ffn]; no biases, as Mixtral and Qwen's MoE), the rows combined back by their
// probabilities, and a shared expert (a SwiGLU MLP every token passes through) added, scaled by
// sigmoid(x·g) under --moe-shared-expert-gate (Qwen2-MoE's shared_expert_gate). The
// backward differentiates Σ dy·y + the aux and z losses. fp32 in and out, double inside.
#pragma once

#include <cstddef>
#include <vector>

#include "executor/kernels/reference/moe_router.h"

namespace megaplan::exec::reference {

struct MoeLayerShape {
  std::size_t tokens = 0;
  std::size_t hidden = 0;
  std::size_t ffn = 0;         // --moe-ffn-hidden-size: each expert's width
  std::size_t shared_ffn = 0;  // --moe-shared-expert-intermediate-size; 0: no shared expert
  bool shared_gate = false;    // --moe-shared-expert-gate
  RouterOptions router;
  double capacity_factor = 0;  // --moe-expert-capacity-factor; 0: dropless
  DropPolicy drop_policy = DropPolicy::kProbs;
  bool pad_to_capacity = false;
  double aux_loss_coeff = 0;  // --moe-aux-loss-coeff (the switch loss over these tokens alone)
  double z_loss_coeff = 0;    // --moe-z-loss-coeff
};

struct MoeLayerWeights {
  const float* router = nullptr;       // [experts x hidden]
  const float* fc1 = nullptr;          // [experts x 2·ffn x hidden]
  const float* fc2 = nullptr;          // [experts x hidden x ffn]
  const float* shared_fc1 = nullptr;   // [2·shared_ffn x hidden], with a shared expert
  const float* shared_fc2 = nullptr;   // [hidden x shared_ffn]
  const float* shared_gate = nullptr;  // [hidden], with the gate
};

// What the forward keeps for the backward, and its outputs.
struct MoeLayerForward {
  std::vector<float> y;  // [tokens x hidden]
  double aux_loss = 0;
  double z_loss = 0;
  std::vector<float> logits;  // [tokens x experts]
  TopK routed;
  Dispatch dispatch;
  std::vector<float> rows;                 // the permuted tokens [dispatch.rows() x hidden]
  std::vector<float> fc1_out;              // [dispatch.rows() x 2·ffn]
  std::vector<float> expert_out;           // [dispatch.rows() x hidden]
  std::vector<float> shared_fc1_out;       // [tokens x 2·shared_ffn]
  std::vector<float> shared_out;           // the shared expert's output before its gate [tokens x hidden]
  std::vector<float> gate_logits;          // x·g [tokens], with the gate
  std::vector<int64_t> tokens_per_expert;  // the aux loss's counts
};

struct MoeLayerGradients {
  std::vector<float> dx, router, fc1, fc2, shared_fc1, shared_fc2, shared_gate;
};

MoeLayerForward moe_layer_forward(const float* x, const MoeLayerWeights& weights, const MoeLayerShape& shape);
MoeLayerGradients moe_layer_backward(const float* dy, const float* x, const MoeLayerWeights& weights,
                                     const MoeLayerShape& shape, const MoeLayerForward& forward);

}  // namespace megaplan::exec::reference
