// One rank's optimizer over its stage chunks, with Megatron's data-parallel semantics:
// - REDUCE_GRAD(s) reduces stage s's gradient buffer bucket by bucket over the data-parallel
//   group (a routed experts' bucket over the expert data-parallel group): an all-reduce, or with
//   the distributed optimizer a reduce-scatter that leaves each rank the reduced shard it owns. The loss is pre-scaled
//   by 1 / (microbatches x dp), so the sums are the data-parallel mean. Buckets holding a tied embedding are
//   all-reduced either way: the embedding group adds the first and last stage's full gradients afterwards. With
//   overlap_grad_reduce (Megatron's --overlap-grad-reduce, which the simulator costs) a bucket's reduction starts as
//   soon as the backward has produced its parameters' gradients of every microbatch (the chunk's gradient progress),
//   REDUCE_GRAD starts whatever has not started, and nothing waits for them before OPTIM: the reductions overlap the
//   backwards still to run. Without it REDUCE_GRAD starts every bucket and waits. The sums are the same bits either
//   way. With the distributed optimizer and overlap_param_gather (Megatron's --overlap-param-gather) the all-gathers of
//   the updated shards are started at OPTIM and waited for only at each chunk's first forward of the next iteration
//   (parameters_ready), so they overlap the work before it; finish_parameter_gathers() ends them all before anything
//   else reads the weights (evaluation, checkpoints, the end of training).
// - OPTIM adds the tied word-embedding gradients of the first and last stage (Megatron's
//   embedding group), computes the global gradient norm over every model-parallel rank (the tied
//   copy counted once; with the distributed optimizer each data-parallel rank adds its shard),
//   clips, steps AdamW on what the rank owns (all of its parameters, or its shard of each bucket),
//   all-gathers the updated shards, and zeroes the gradients.
// AdamW's moments live here: for every parameter, or for the owned shards only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "executor/comm/comm.h"
#include "executor/model/stage_chunk.h"
#include "executor/runtime/backend.h"

namespace megaplan::exec {

struct OptimizerGroups {
  Comm* data_parallel = nullptr;   // this rank's dp group
  Comm* model_parallel = nullptr;  // tp x pp: the gradient norm's reduction
  Comm* embedding = nullptr;       // the ranks of stage 0 and the last stage, when they differ and share weights
  // Where the expert layers' groups differ from the dense layers' (`experts_apart`: ep > 1, or
  // etp other than tp): the ranks holding other experts (null at ep 1; their gradients' squares join
  // the norm's), and Megatron's expert data-parallel group, which sums (and the distributed
  // optimizer shards) the routed experts' gradient buckets in place of the dp group (null when it
  // has one member). Otherwise the two data-parallel groups are one.
  bool experts_apart = false;
  Comm* expert_parallel = nullptr;
  Comm* expert_data_parallel = nullptr;
  // With etp other than tp (`experts_cut_apart`), the routed experts' squares join the norm over
  // their own tensor-parallel group (null at etp 1) and the pipeline, not over tp x pp.
  bool experts_cut_apart = false;
  Comm* expert_tensor_parallel = nullptr;
  Comm* pipeline = nullptr;
  // The rank's tp group: with the data-parallel group, every rank of its stages (the expert biases'
  // counts sum over them).
  Comm* tensor_parallel = nullptr;
};

struct OptimizerSettings {
  double weight_decay = 0.01;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double clip_grad = 1.0;  // 0: no clipping
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  int64_t microbatches = 1;               // per iteration: a gradient is final after this many backwards
  double expert_bias_update_rate = 1e-3;  // --moe-router-bias-update-rate
};

class Optimizer {
 public:
  // `chunks` are the rank's stages in increasing stage order.
  Optimizer(std::vector<StageChunk*> chunks, const OptimizerGroups& groups, bool distributed,
            const OptimizerSettings& settings, Backend& backend);
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // The backwards per iteration from the next iteration on (a --rampup-batch-size step).
  // REQUIRES: between iterations.
  void set_microbatches(int64_t microbatches) { settings_.microbatches = microbatches; }
  // REDUCE_GRAD for the rank's chunk of `stage`.
  void reduce_gradients(int64_t stage);
  // OPTIM's first step, before the norm, as Megatron's finalize_model_grads: the aux-loss-free
  // balancing (--moe-router-enable-expert-bias). Each chunk's counts of its MoE layers' routed rows
  // (StageChunk::expert_biases) are summed over the tp group, then the data-parallel group (dp x cp):
  // over every token of the iteration, each rank having routed its own. Each expert bias then moves
  // by ±rate toward balance, and the counts start again. Runs on iterations that skip their step too
  // (Megatron updates before it knows). The counts travel as fp32, as Megatron's do: exact below
  // 2^24 rows of an expert an iteration. A no-op without expert biases.
  void update_expert_biases();
  // The global gradient norm before clipping (non-finite when a gradient is).
  double gradient_norm();
  // OPTIM after gradient_norm(): multiply the gradients by `unscale` (a loss scaler's 1 / scale;
  // `gradient_norm` is of the unscaled ones), clip with the norm, step Adam (`update`: its step,
  // from 1, for the bias corrections), gather (or start gathering), zero the gradients.
  void step(int64_t update, double lr, double gradient_norm, double unscale = 1);
  // OPTIM of an iteration whose gradients overflowed: the gradients zeroed, nothing else changed.
  void skip();
  // Before F of `stage`: its chunk's parameters are gathered and its compute weights refreshed.
  void parameters_ready(int64_t stage);
  // Every chunk's, before the weights are read otherwise.
  void finish_parameter_gathers();
  // Every parameter's whole moments on the device, in chunk and registration order: visit(p,
  // first, second), p.size floats each, readable during the call only. With the distributed
  // optimizer over several data-parallel ranks it is a collective over the data-parallel group, and
  // the expert data-parallel group (every member calls it): the owned shards' moments are
  // all-gathered, chunk by chunk, into a scratch buffer. A saving checkpoint downloads them in pieces.
  using MomentVisitor = std::function<void(const Parameter&, const float* first_moment, const float* second_moment)>;
  void visit_moments(const MomentVisitor& visit);
  // Elements [begin, begin + n) of `parameter`'s first (`second` false) or second moment set from
  // `host` (the distributed optimizer keeps what lies in its shard): a load sets every element of
  // every parameter this way, in any order and in pieces of any size. REQUIRES: `parameter` is one
  // of the chunks' and the range lies within it (std::logic_error otherwise).
  void import_moment(const Parameter& parameter, bool second, std::size_t begin, const float* host, std::size_t n);
  // The first parameter, in chunk order, whose gradient is not finite ("" when none).
  std::string first_non_finite_gradient();

 private:
  struct Piece {  // what AdamW updates: a parameter, or the part of it inside an owned shard
    const Parameter* parameter;
    std::size_t offset, size;  // within the parameter
    float* first_moment;
    float* second_moment;
  };
  // The pieces AdamW updates; for the norm, each gradient once, and only the routed experts' or
  // only the others' (`experts`).
  std::vector<OptimizerTensor> tensors(bool for_norm, bool experts = false) const;
  // The group a bucket's gradient reduces over (null: one member); the routed experts' replicas.
  Comm* group_of(const GradientBucket& bucket) const;
  Comm* expert_replicas() const;
  bool tied(const Parameter& parameter) const;

  std::vector<StageChunk*> chunks_;
  OptimizerGroups groups_;
  bool distributed_;
  OptimizerSettings settings_;
  Backend& backend_;
  std::vector<float*> moment_buffers_;  // owned, released at destruction
  std::vector<Piece> pieces_;
  // Overlapped reduction, by chunk: how many microbatches' gradients each part (keyed by its first
  // parameter) holds, and which buckets have started; the reductions not yet waited for.
  struct Progress {
    std::map<std::size_t, int64_t> done;
    std::vector<bool> started;
  };
  std::vector<Progress> progress_;
  std::vector<Request> reducing_;
  std::vector<std::vector<Request>> gathering_;  // by chunk: the updated shards' all-gathers in flight
  void finish_gather(std::size_t chunk);
  // The index in chunks_ of `stage`'s chunk; std::logic_error naming `action` when the rank lacks it.
  std::size_t chunk_of(int64_t stage, const char* action) const;
  void gradients_done(std::size_t chunk, std::size_t first);
  void start_reduction(std::size_t chunk, std::size_t bucket);
  void finish_reductions();
  // Distributed: the owned shard's moments of each bucket (first, second), by chunk and bucket.
  std::vector<std::vector<std::pair<float*, float*>>> shard_moments_;
};

}  // namespace megaplan::exec
