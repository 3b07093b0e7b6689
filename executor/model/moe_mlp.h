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
//
// Expert parallelism (Megatron-Core's all-to-all token dispatcher): each of the ep group's ranks
// holds experts / ep of the layer's experts (rank r: r x experts / ep onwards), routes its own
// tokens to all of them, and sends each rank the rows of that rank's experts with one all-to-all;
// the ranks first all-gather every rank's row counts per expert, which size the exchange and each
// expert's GEMMs. The rows arrive grouped by sender, then expert; they are regrouped by expert
// (each expert's GEMM over one run of rows), computed, regrouped by sender and sent back by a
// second all-to-all, into the dispatch's order, where combine reads them. The backward exchanges
// the gradients the same two ways. Every member runs each MoE layer's forward and backward in the
// same order (the ep group lies inside the data-parallel group, whose members run one schedule).
//
// Tensor parallelism (Megatron-Core's expert tensor parallelism at etp = tp, with sequence
// parallelism): each tp rank routes its own rows of the stream and dispatches them (over its ep
// group), the tp group all-gathers its members' counts, then the rows that arrived for each
// member's experts (each member's padded to the group's most: one all-gather), and every member
// computes its shard of every row (fc1 column-, fc2 row-parallel); the partial outputs are
// reduce-scattered back to the members whose rows they are. The backward gathers the outputs'
// gradients and reduce-scatters the inputs'. The router and the shared expert's gate are whole on
// every tp rank (their gradients summed over tp with the norms'); the aux loss's counts are summed
// over the tp group, whose tokens it balances, and the z loss (and the sequence loss, each rank's
// rows whole sequences) is each member's share of the group's mean; the shared expert is a
// tensor-parallel MLP over the group's rows, gathered.
//
// With --expert-tensor-parallel-size 1 under tp > 1 (each rank's experts whole, Megatron's
// recommended cut for fine-grained experts) nothing of the above crosses the tp group for the
// routed experts: each tp rank routes its own rows, dispatches them over its ep group (which then
// spans tp ranks) and computes whole experts; the shared expert, the router's and gate's gradients
// and the losses stay the tp group's as above, and the experts' load for the log is summed over it.
// Any other etp group (a part of the tp group, or one across data-parallel replicas' tp groups)
// runs as etp = tp does over that group: it gathers its members' counts and arrived rows, each
// member computes its shard of every row, and the outputs are reduce-scattered; the rest stays the
// tp group's as at etp 1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "core/layer_recipe.h"
#include "executor/comm/comm.h"
#include "executor/kernels/moe_routing.h"
#include "executor/runtime/backend.h"

namespace megaplan::exec {

struct MoeMlpShape {
  std::size_t tokens = 0;  // the rows it routes (under tensor parallelism the rank's rows of the stream)
  std::size_t hidden = 0;
  std::size_t ffn = 0;         // each expert's width on the rank (--moe-ffn-hidden-size / tp)
  std::size_t shared_ffn = 0;  // the shared expert's (--moe-shared-expert-intermediate-size / tp); 0: none
  bool shared_gate = false;    // sigmoid(x·g) scales the shared expert (--moe-shared-expert-gate)
  MoeRouter router;
  MoeCapacity capacity;  // capacity 0: dropless (router.experts: all of the layer's experts)
  // --moe-aux-loss-coeff: the switch loss over these tokens, or under seq_aux_loss (sequences > 0)
  // the mean over that many runs of rows (the microbatch's sequences) of each one's own.
  double aux_loss_coeff = 0;
  std::size_t aux_loss_sequences = 0;
  double z_loss_coeff = 0;  // --moe-z-loss-coeff

  // Its buffers' widths as core's recipe prices them, its experts over `expert_parallel` ranks and
  // cut over `tensor_parallel`.
  MoeDims dims(int64_t expert_parallel = 1, int64_t tensor_parallel = 1, int64_t context_parallel = 1,
               int64_t expert_tensor_parallel = 0) const;
};

// The weights as the layers read them (compute copies): the router [experts x hidden], each of the
// rank's experts' fc1 [2 ffn x hidden] (gate rows, then up) and fc2 [hidden x ffn], the shared
// expert's and its gate [1 x hidden] (null without them).
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

// The router losses as Megatron logs them: each loss without its coefficient (load_balancing_loss
// or seq_load_balancing_loss, and z_loss), summed over the forwards that added them; and the
// experts' load by layer (its index in the model): each dispatch's busiest expert's rows over the
// mean rows of an expert (under expert parallelism the ep group's rows, every member's tokens),
// summed likewise. Its mean is the load imbalance a user states to the simulator (1: balanced).
struct RouterLosses {
  double balancing = 0;
  double z = 0;
  std::map<int64_t, double> expert_load_by_layer;
  RouterLosses& operator+=(const RouterLosses& other) {
    balancing += other.balancing;
    z += other.z;
    for (const auto& [layer, load] : other.expert_load_by_layer) expert_load_by_layer[layer] += load;
    return *this;
  }
};

// What a forward keeps for its backward (core/layer_recipe.h's MoeLayerBuffers and, allocated by
// the forward once it knows how many rows its experts compute, MoeExpertBuffers), each expert's
// row count from its dispatch (all of the layer's experts) and, under expert or tensor
// parallelism, the rows each sender's run holds for each of this rank's experts (sender-major:
// [tp x ep x local experts], the rank's tp group's members outermost; each member's ep group's
// dispatches to the member) and the room each tp member's rows take in the gathered rows (the
// most that arrived for any member).
struct MoeMlpSaved : MoeLayerBuffers<Activation, float*, int32_t*> {
  MoeExpertBuffers<Activation> expert;
  std::size_t expert_rows_held = 0;  // the rows `expert` holds
  std::vector<int64_t> rows_per_expert;
  std::vector<int64_t> received;
  std::size_t room = 0;
  std::vector<double> group_rows;  // expert or tensor parallelism: every member's rows of each expert
};

// What I keeps for W (core's MoeDeferred): each deferred weight GEMM's output gradient.
using MoeMlpDeferred = MoeDeferred<Activation>;

class MoeMlp {
 public:
  // Allocates the scratch both directions use (core's moe_scratch and moe_expert_scratch; the
  // latter grows when a forward's experts compute more rows than it holds). `expert_parallel`: the
  // rank's ep group (null: ep 1), whose size divides the experts; `tensor_parallel`: its tp group
  // (null: tp 1), over which `shape`'s widths are the rank's shards; `context_parallel`: its cp group
  // (null: cp 1), whose members route their own tokens of the same sequences; `expert_tensor_parallel`:
  // the group the routed experts are cut over (--expert-tensor-parallel-size; unset: the tp group,
  // null: etp 1, each rank's experts whole, `shape`'s ffn their full width; else a group of etp).
  MoeMlp(const MoeMlpShape& shape, Backend& backend, Comm* expert_parallel = nullptr, Comm* tensor_parallel = nullptr,
         Comm* context_parallel = nullptr, std::optional<Comm*> expert_tensor_parallel = std::nullopt);
  ~MoeMlp();
  MoeMlp(const MoeMlp&) = delete;
  MoeMlp& operator=(const MoeMlp&) = delete;

  const MoeMlpShape& shape() const { return shape_; }
  // Core's moe_kept (the expert buffers are the forward's).
  MoeMlpSaved allocate_saved();
  void release(MoeMlpSaved& saved);

  // y [tokens x hidden] from x [tokens x hidden]; `x_gathered`: under tensor parallelism with a
  // shared expert the tp group's x, all-gathered in rank order (else x). With `add_losses` the
  // balancing and z losses (without their coefficients, as Megatron logs them) are added to running
  // sums on the backend (take_losses), as the LM loss's, and the experts' load to layer `layer`'s;
  // `expert_bias` ([experts] fp32, null: none) moves the choice only.
  void forward(ConstActivation x, ConstActivation x_gathered, const MoeMlpWeights& weights, const float* expert_bias,
               MoeMlpSaved& saved, Activation y, bool add_losses, int64_t layer = 0);
  // dx [tokens x hidden] (overwritten) and the weights' gradients (added) from dy; the losses'
  // gradients times loss_gradient_scale. Under I (`deferred` not null: allocate_deferred's for
  // `saved`) no weight gradients: each weight GEMM's output gradient is kept in `deferred`, and
  // `saved` with it, for weight_gradients.
  void backward(ConstActivation dy, ConstActivation x, ConstActivation x_gathered, const MoeMlpWeights& weights,
                const MoeMlpSaved& saved, const MoeMlpGradients& gradients, float loss_gradient_scale, Activation dx,
                MoeMlpDeferred* deferred = nullptr);
  // W: the weight gradients (added) I deferred, from x and x_gathered as backward's.
  void weight_gradients(ConstActivation x, ConstActivation x_gathered, const MoeMlpSaved& saved,
                        const MoeMlpDeferred& deferred, const MoeMlpGradients& gradients);
  // Core's moe_deferred at the rows `saved`'s expert buffers hold, and back.
  MoeMlpDeferred allocate_deferred(const MoeMlpSaved& saved);
  void release(MoeMlpDeferred& deferred);
  // The router losses the forwards added since the last call (waits for them; under tensor
  // parallelism summed over the tp group, every member calling), then 0 again.
  RouterLosses take_losses();

 private:
  // The losses' gradients, coefficients included, times `scale` into d_logits.
  void router_loss_gradients(const MoeMlpSaved& saved, float* d_logits, float scale);
  // run(local expert, first row, rows) for each of the rank's experts with rows.
  template <typename Run>
  void for_each_expert(const MoeMlpSaved& saved, const Run& run) const;
  // Rows each of the rank's experts computes, and all of them.
  std::vector<int64_t> local_rows(const MoeMlpSaved& saved) const;
  std::size_t expert_rows(const MoeMlpSaved& saved) const;
  // The experts' load a training forward logs: the busiest expert's rows over the mean, of the
  // rank's dispatch or (expert or tensor parallelism) its groups', summed over the cp group without
  // expert parallelism (the microbatch's tokens, as one rank routes them); under context
  // parallelism each member's share of it (the trainer sums the shares as it sums the losses').
  double logged_load(const MoeMlpSaved& saved);
  // Expert or tensor parallelism: every ep and tp member's row counts per expert gathered into
  // saved.received and saved.room; returns the rows the rank's experts compute. The exchange over
  // the ep group of rows [.. x hidden] from the dispatch's order to the experts' ranks (grouped by
  // sender), or back (`returning`).
  std::size_t gather_counts(MoeMlpSaved& saved);
  Request exchange(const MoeMlpSaved& saved, ConstActivation input, Activation output, bool returning);
  // Rows grouped by sender then expert (each tp member's runs in its room) into rows grouped by
  // expert then sender, or back.
  void regroup(const MoeMlpSaved& saved, Activation from, Activation to, bool by_expert);
  // Where the rows that arrive for this rank's experts lie, grouped by sender: its room of the
  // gathered rows under tensor parallelism.
  Activation own_room(const MoeMlpSaved& saved);
  // The expert scratch holding at least `rows` arrived rows a tp member.
  void reserve_arrived_rows(std::size_t rows);

  MoeMlpShape shape_;
  Backend& backend_;
  Comm* expert_parallel_;
  Comm* tensor_parallel_;
  Comm* context_parallel_;
  Comm* expert_tensor_parallel_;  // the routed experts' (etp) group: the tp group, or null at etp 1
  MoeDims dims_;                  // dims_.arrived_rows: what the expert scratch holds
  MoeScratch<Activation, float*> scratch_;
  MoeExpertScratch<Activation> expert_scratch_;
  double* balancing_sum_ = nullptr;  // scratch_.loss_memory's two doubles
  double* z_sum_ = nullptr;
  std::map<int64_t, double> expert_load_by_layer_;  // on the host, where the dispatches' counts are
};

}  // namespace megaplan::exec
