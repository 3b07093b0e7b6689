// A decoder layer's mixture-of-experts MLP on a Backend (issue 40): Megatron-Core's MoELayer on one
// rank, as executor/kernels/reference/moe_layer.h defines it — the router GEMM, the top-k routing,
// the tokens permuted expert by expert, each expert a SwiGLU MLP over its rows (its fc1 and fc2 one
// GEMM each over that run of rows: a grouped GEMM as a batched launch; SwiGLU over all rows at
// once), the rows combined back by their probabilities, and a shared expert every token passes
// through. Its backward adds the load-balancing and z losses' gradients to the router's, times
// the scale the LM loss's gradient carries (Megatron's MoEAuxLossAutoScaler).
//
// Dropless, a route a row (tokens x topk rows); with a capacity, at most experts x capacity rows.
// Each expert's row count is known on the host after the dispatch (Backend::moe_dispatch), and
// sizes its GEMMs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "executor/kernels/moe_routing.h"
#include "executor/runtime/backend.h"

namespace megaplan::exec {

struct MoeMlpShape {
  std::size_t tokens = 0;  // the GEMMs' rows
  std::size_t hidden = 0;
  std::size_t ffn = 0;         // each expert's width (--moe-ffn-hidden-size)
  std::size_t shared_ffn = 0;  // the shared expert's (--moe-shared-expert-intermediate-size); 0: none
  bool shared_gate = false;    // sigmoid(x·g) scales the shared expert (--moe-shared-expert-gate)
  MoeRouter router;
  MoeCapacity capacity;  // capacity 0: dropless
  // --moe-aux-loss-coeff: the switch loss over these tokens, or under seq_aux_loss (sequences > 0)
  // the mean over that many runs of rows (the microbatch's sequences) of each one's own.
  double aux_loss_coeff = 0;
  std::size_t aux_loss_sequences = 0;
  double z_loss_coeff = 0;  // --moe-z-loss-coeff

  // The most rows a dispatch makes: every route dropless, each expert's capacity with one (exactly
  // that, padded).
  std::size_t most_rows() const;
};

// The weights as the layers read them (compute copies): the router [experts x hidden], each
// expert's fc1 [2 ffn x hidden] (gate rows, then up) and fc2 [hidden x ffn], the shared expert's
// and its gate [1 x hidden] (null without them).
struct MoeMlpWeights {
  ConstActivation router = nullptr;
  std::vector<ConstActivation> fc1, fc2;
  ConstActivation shared_fc1 = nullptr, shared_fc2 = nullptr, shared_gate = nullptr;
};
// Their fp32 gradients, accumulated (+=).
struct MoeMlpGradients {
  float* router = nullptr;
  std::vector<float*> fc1, fc2;
  float* shared_fc1 = nullptr;
  float* shared_fc2 = nullptr;
  float* shared_gate = nullptr;
};

// What a forward keeps for its backward: the router's logits, each token's experts and
// probabilities, the dispatch's maps and row counts, the permuted rows (fc1's input), fc1's output
// (SwiGLU's input), the experts' outputs (combine's gradient reads them), the aux loss's counts and
// the shared expert's fc1 output, and with its gate its output and the gate's logit.
struct MoeMlpSaved {
  Activation logits = nullptr, rows = nullptr, fc1_out = nullptr, expert_out = nullptr, shared_fc1_out = nullptr,
             shared_out = nullptr, gate_logits = nullptr;
  float* probs = nullptr;
  float* aux_counts = nullptr;
  int32_t* experts = nullptr;
  MoeDispatchMaps maps;
  std::vector<int64_t> rows_per_expert;
};

class MoeMlp {
 public:
  // Allocates the scratch both directions use.
  MoeMlp(const MoeMlpShape& shape, Backend& backend);
  ~MoeMlp();
  MoeMlp(const MoeMlp&) = delete;
  MoeMlp& operator=(const MoeMlp&) = delete;

  const MoeMlpShape& shape() const { return shape_; }
  MoeMlpSaved allocate_saved();
  void release(MoeMlpSaved& saved);

  // y [tokens x hidden] from x [tokens x hidden]; the aux and z losses (coefficients included) added
  // to *loss_sum where it is not null (backend memory, as the LM loss's); `expert_bias` ([experts]
  // fp32, null: none) moves the choice only.
  void forward(ConstActivation x, const MoeMlpWeights& weights, const float* expert_bias, MoeMlpSaved& saved,
               Activation y, double* loss_sum);
  // dx [tokens x hidden] (overwritten) and the weights' gradients (added) from dy; the losses'
  // gradients times loss_gradient_scale.
  void backward(ConstActivation dy, ConstActivation x, const MoeMlpWeights& weights, const MoeMlpSaved& saved,
                const MoeMlpGradients& gradients, float loss_gradient_scale, Activation dx);

 private:
  // The losses' value (into loss_sum) and gradient (into d_logits), either may be null.
  void router_losses(const MoeMlpSaved& saved, double* loss_sum, float* d_logits, float scale);
  // run(expert, first row, rows) for each expert with rows.
  template <typename Run>
  void for_each_expert(const MoeMlpSaved& saved, const Run& run) const;

  MoeMlpShape shape_;
  Backend& backend_;
  std::size_t most_rows_;
  // Scratch: SwiGLU's output over the rows (and its gradient, the shared expert's too), the experts'
  // outputs', fc1's and the rows' gradients, the probabilities' and logits' (fp32, and the logits'
  // in the compute type), a part of dx, and the shared expert's SwiGLU output and output.
  Activation activated_ = nullptr, d_activated_ = nullptr, d_expert_out_ = nullptr, d_fc1_out_ = nullptr,
             d_rows_ = nullptr, d_logits_compute_ = nullptr, dx_part_ = nullptr, shared_activated_ = nullptr,
             shared_out_ = nullptr;
  float* d_probs_ = nullptr;
  float* d_logits_ = nullptr;
  float* d_gate_ = nullptr;              // the shared expert's gate logit's gradient (fp32)
  Activation d_gate_compute_ = nullptr;  // and in the compute type
};

}  // namespace megaplan::exec
