// One virtual pipeline stage of core's decoder on a Backend: GPT's (learned absolute positions,
// LayerNorm, GELU (tanh), biases, tied input and output embeddings) or the Llama family's (RMSNorm,
// SwiGLU, rotary position embeddings, grouped-query attention, untied output layer, no biases, QKV
// biases for Qwen2, a head dimension of its own), as ModelSpec says: the transformer layers
// core/pipeline_layout gives the stage, the embeddings on the first stage, and the final norm,
// output layer and loss on the last. With one stage it is the whole model. fp32 master weights and
// gradients accumulated over microbatches live in one contiguous buffer each (Megatron DDP's
// layout, parameter_layout.h); activations and each weight's compute copy are in the backend's
// compute precision (bf16 on the GPU). Every parameter says how tensor parallelism splits it.
// Its widths, its architecture's choices and every buffer it allocates are core's layer recipe
// (core/layer_recipe.h), which the simulator's kernel lists and memory walk read too.
//
// Tensor parallelism is Megatron's: QKV and fc1 are column-parallel (each rank holds its query
// groups' queries, keys and values, Megatron's fused layout [groups, group + 2, dim], and its slice
// of the MLP: with SwiGLU its slices of the gate and of the up projection, [gate_r; up_r]), the
// projection and fc2 row-parallel (their partial outputs summed over the tensor-parallel group),
// the word embedding and the output layer vocabulary-
// parallel (the cross entropy's row statistics gathered, vocabulary_parallel_loss.h). Without
// sequence parallelism every rank holds the whole residual stream and the sums are all-reduces;
// with it (--sequence-parallel) each rank holds 1/tp of the stream's rows, norms and residual adds
// run on them, the column-parallel inputs are all-gathered and the sums reduce-scattered. A
// row-parallel bias (and the position embedding) is added once, by tensor-parallel rank 0, before
// the sum; every rank computes its gradient from the whole output gradient.
//
// The runtime drives a stage through the schedule's actions: F is forward(), B is
// backward_input() with the weight gradients computed at once, I is backward_input() deferring
// them and W is backward_weight(). Between stages, activations and their gradients are
// [micro batch x seq, hidden] buffers: a non-first stage's input is written into input_buffer()
// (by a receive, or a copy from the previous stage on the same rank) before its F, a non-last
// stage's output() is read after it; a non-last stage's backward reads the gradient of its output,
// a non-first stage's backward writes the gradient of its input.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/layer_recipe.h"
#include "core/model_spec.h"
#include "core/parallel_plan.h"
#include "core/parameter_list.h"
#include "core/pipeline_layout.h"
#include "executor/comm/comm.h"
#include "executor/kernels/dropout_mask.h"
#include "executor/model/moe_mlp.h"
#include "executor/model/tensor_shards.h"
#include "executor/runtime/backend.h"

namespace megaplan::exec {

// The cut (tensor_shards.h) a spec's split and shard describe.
TensorCut tensor_cut(const ParameterSpec& spec);

struct Parameter : ParameterSpec {
  float* value = nullptr;        // fp32 master weight: a view into the stage's parameter buffer
  float* gradient = nullptr;     // fp32, accumulated over microbatches: a view into the gradient buffer
  Activation compute = nullptr;  // the weight in compute precision, as the layers read it
};

// One microbatch as the data loader gives it: micro_batch_size rows of seq_length + 1 tokens
// (inputs, then labels shifted by one) and a loss mask of micro_batch_size x seq_length: the whole
// sequences, of which a context-parallel rank takes its chunks.
struct MicrobatchTokens {
  std::vector<int64_t> tokens;
  std::vector<float> loss_mask;
};

// How the weights are drawn: Megatron's --seed and --init-method-std.
struct Initialisation {
  uint64_t seed = 1234;
  double init_method_std = 0.02;
};

class StageChunk {
 public:
  // Throws SpecError naming the flag of the first thing this executor does not support yet
  // (GELU without biases, LayerNorm with another epsilon than 1e-5, context parallelism, Megatron's
  // implementations).
  static void refuse_unsupported(const ModelSpec& model, const ParallelPlan& plan);

  // Refuses what refuse_unsupported() refuses. Weights: normal(0, init.init_method_std), the
  // projection and fc2 scaled by 1/sqrt(2 * layers) as Megatron does; biases 0; norms 1 and 0. Each
  // element is drawn on the backend from `init.seed`, its parameter's name and its index in the
  // whole tensor (kernels/normal_draws.h), so a stage holds exactly the values the whole model
  // would. `tied_embedding` is the word embedding of stage 0 when it lives on this rank and this is
  // another, last stage (the V's turn): the output layer reads it and adds its gradient there.
  // `tensor_parallel` is the rank's tp group (null when tp = 1); the model holds that rank's shard
  // of every split parameter, and draws only it: the whole tensor's elements at the shard's places.
  // Gradients are reduced in buckets of `bucket_size` elements (Megatron's --ddp-bucket-size; 0:
  // its default). `context_parallel` is the rank's cp group (null when cp = 1): the rank holds two
  // chunks of every sequence (core/context_parallel.h) and attention runs as a ring over the group.
  // `expert_parallel` is the rank's ep group (null when ep = 1): the rank holds its experts of every
  // MoE layer (core/parameter_list.h) and exchanges tokens over the group (moe_mlp.h).
  // `expert_tensor_parallel` is the group the routed experts are cut over where the plan's etp is
  // not tp (unset: the tp group; null: etp 1, every expert whole on the rank; else the etp group).
  StageChunk(const ModelSpec& model, const ParallelPlan& plan, int64_t stage, Backend& backend,
             const Initialisation& init, Parameter* tied_embedding = nullptr, Comm* tensor_parallel = nullptr,
             std::size_t bucket_size = 0, Comm* context_parallel = nullptr, Comm* expert_parallel = nullptr,
             std::optional<Comm*> expert_tensor_parallel = std::nullopt);
  ~StageChunk();
  StageChunk(const StageChunk&) = delete;
  StageChunk& operator=(const StageChunk&) = delete;

  int64_t tensor_parallel_rank() const { return tp_rank_; }
  // The gradients of tensors whole on every tp rank that each rank computes a part of, summed over
  // the tensor-parallel group (Megatron's all-reduce of layernorm gradients) before the
  // data-parallel reduction reads them: under sequence parallelism the norms' (and an MoE layer's
  // router's and shared gate's), each rank's over its rows; the query and key norms'
  // (--qk-layernorm), each rank's over its heads. Those of the parameters with registration index
  // in [first, last]; a no-op without tensor parallelism.
  void reduce_replicated_gradients(std::size_t first = 0, std::size_t last = SIZE_MAX);

  // Called as a backward finishes a microbatch's gradients of a part of the chunk (in B, or in W
  // after I): every parameter from registration index `first` on then holds that microbatch's
  // gradient. The parts, in backward order: the final norm and output layer, each layer from the
  // last, the embedding. (The optimizer starts a bucket's data-parallel reduction once its
  // parameters hold every microbatch's: Megatron's --overlap-grad-reduce.)
  using GradientProgress = std::function<void(std::size_t first)>;
  void on_gradient_progress(GradientProgress progress) { gradient_progress_ = std::move(progress); }

  int64_t stage() const { return stage_; }
  bool first_stage() const { return has_embedding_; }
  bool last_stage() const { return has_output_; }
  std::vector<Parameter>& parameters() { return parameters_; }
  const std::vector<Parameter>& parameters() const { return parameters_; }
  // Whether the output layer reads the word embedding (GPT's tying) rather than a weight of its own.
  bool tied_embeddings() const { return !untied_; }
  // The stage's word embedding, or its output layer's own copy of it when tied (null when neither).
  Parameter* word_embedding() { return word_embeddings_; }
  Parameter* output_weight_copy() { return output_copy_; }
  const ParameterLayout& layout() const { return layout_; }
  float* parameter_buffer() { return values_; }
  float* gradient_buffer() { return gradients_; }
  // After master weights change other than through the optimizer's compute-copy refresh.
  void refresh_compute_weights();
  void zero_gradients();
  // Elements of one activation or gradient message between stages: the rank's rows of the residual
  // stream (micro batch x seq, over tp under sequence parallelism) x hidden.
  std::size_t message_size() const { return width_.rows * width_.hidden; }

  // REQUIRES: !first_stage(). Where F(microbatch) reads its input; valid until its backward.
  Activation input_buffer(int64_t microbatch);
  // F. `data` is read on the first stage (inputs) and the last (labels, mask). The last stage adds
  // the microbatch's masked mean loss to a sum kept on the backend: nothing waits for it.
  // `first_sample` is the global sample of the microbatch's first sequence (its place in the run's
  // sample order): where dropout's masks are drawn (executor/kernels/dropout_mask.h), for this
  // forward and the microbatch's backward alike.
  void forward(int64_t microbatch, const MicrobatchTokens* data, int64_t first_sample = 0);
  // REQUIRES: last_stage(). The sum of the microbatch losses since the last call (waits for them),
  // then 0 again.
  double take_loss_sum();
  // The router losses (moe_mlp.h: without their coefficients, as Megatron logs them) the chunk's MoE
  // layers added in their training forwards since the last call, summed over layers and
  // microbatches, then 0 again; 0 without MoE layers.
  RouterLosses take_router_losses();
  // Aux-loss-free balancing (--moe-router-enable-expert-bias): the chunk's MoE layers' expert biases
  // ([layers x experts] fp32 on the backend, 0 at the start; layer by layer in order), which move
  // each router's choice, and the rows each layer's training forwards dispatched to each expert since
  // the counts were last taken (Megatron's local_tokens_per_expert, on the host, where the dispatch
  // returns them). Empty (and the pointers null) without expert biases or MoE layers.
  struct ExpertBiases {
    std::vector<int64_t> layers;  // the model's index of each MoE layer
    float* biases = nullptr;
    float* counts = nullptr;      // room for the counts as fp32, where the optimizer sums them
    std::vector<int64_t> routed;  // [layers x experts]
    std::size_t experts = 0;
  };
  ExpertBiases& expert_biases() { return expert_biases_; }

  // REQUIRES: !last_stage() and forward(microbatch) ran. Valid until the microbatch's backward.
  ConstActivation output(int64_t microbatch) const;
  // B (defer_weight_gradients false) or I (true). The last stage starts from loss * loss_scale,
  // others from `output_gradient`; a non-first stage writes its input's gradient to
  // `input_gradient` (message_size() elements). B releases the microbatch's activations; after I
  // they wait for backward_weight().
  void backward_input(int64_t microbatch, ConstActivation output_gradient, float loss_scale, Activation input_gradient,
                      bool defer_weight_gradients);
  // W: the weight gradients I deferred. REQUIRES: backward_input(microbatch, ..., true) ran.
  void backward_weight(int64_t microbatch);
  // A forward that keeps nothing (evaluation): input as forward's (null on the first stage);
  // writes output (non-last stages) and returns the loss (last stage).
  double evaluate(const MicrobatchTokens* data, ConstActivation input, Activation output);

 private:
  struct Layer {  // null where the model has none (norm biases with RMSNorm, linear biases when off)
    Parameter* ln1_gamma;
    Parameter* ln1_beta;
    Parameter* qkv_weight;
    Parameter* qkv_bias;
    Parameter* proj_weight;
    Parameter* proj_bias;
    Parameter* ln2_gamma;
    Parameter* ln2_beta;
    Parameter* fc1_weight;
    Parameter* fc1_bias;
    Parameter* fc2_weight;
    Parameter* fc2_bias;
    // An MoE layer's MLP in place of fc1 and fc2 (null and empty in a dense layer): the router, each
    // expert's fc1 and fc2, the shared expert and its gate.
    bool moe = false;
    Parameter* router = nullptr;
    std::vector<Parameter*> expert_fc1, expert_fc2;
    Parameter* shared_fc1 = nullptr;
    Parameter* shared_fc2 = nullptr;
    Parameter* shared_gate = nullptr;
    std::size_t expert_bias = 0;  // with expert biases: the layer's among them
    // --qk-layernorm's query and key norms (null without).
    Parameter* q_norm = nullptr;
    Parameter* k_norm = nullptr;
  };
  // An MoE layer's weights and gradients as the MoE MLP reads them.
  static MoeMlpWeights moe_weights(const Layer& layer);
  static MoeMlpGradients moe_gradients(const Layer& layer);
  // Core's buffer structs (core/layer_recipe.h) holding this backend's buffers: what a layer keeps
  // for its backward (null where its Keep does not keep it, and the means with RMSNorm), a
  // microbatch's buffers outside its layers, I's deferred output gradients, the chunk's scratch.
  using LayerActivations = LayerBuffers<Activation, float*>;
  using MicrobatchActivations = MicrobatchBuffers<Activation, float*>;
  using DeferredGradients = megaplan::DeferredGradients<Activation>;
  using Scratch = ChunkScratch<Activation, float*>;
  using Keep = LayerKeep;  // core/pipeline_layout.h
  // A set of the recomputation pool: a whole layer's buffers and, on a chunk whose MoE layers do not
  // all keep their MLP's (core's lent_sets_hold_moe), an MoE MLP's, on which a fully recomputed MoE
  // layer runs its forward and its forward again.
  struct LentSet {
    LayerActivations layer;
    MoeMlpSaved moe;
  };
  struct Activations {
    std::vector<int64_t> inputs, labels;
    std::vector<float> weights;  // each token's share of the microbatch's loss (Backend::cross_entropy_finish)
    std::vector<LayerActivations> layers;
    // By layer: what an MoE layer's MLP keeps (empty in a dense layer, and where full recomputation
    // runs it again on a lent set's: keeps_moe_buffers).
    std::vector<MoeMlpSaved> moe;
    MicrobatchActivations head;
    std::vector<DeferredGradients> deferred;  // filled by I
    // By layer, an MoE layer's MLP's under I (empty in a dense layer), and where its forward's
    // buffers are: its own (SIZE_MAX) or those of borrowed[i] (full recomputation's).
    std::vector<MoeMlpDeferred> moe_deferred;
    std::vector<std::size_t> moe_lent;
    // The backward's view of every layer: kept buffers, and recomputed ones from `borrowed`
    // (kept with the microbatch from I until W, else returned after each group).
    std::vector<LayerActivations> work;
    std::vector<LentSet> borrowed;
    Activation input_gradient = nullptr;  // first stage under I: the embedding's, for W
    // forward()'s: where dropout's masks are drawn; none in evaluation, which drops nothing.
    std::optional<int64_t> first_sample;
  };
  // The buffers `sizes` lists (core's recipe), into `buffers`; and back.
  template <typename Sizes, typename Buffers>
  void allocate(const Sizes& sizes, Buffers& buffers);
  template <typename Buffers>
  void release(Buffers& buffers);
  void add_parameter(const ParameterSpec& spec);
  void initialise(const Initialisation& init);
  Activations allocate_activations();
  void release_activations(Activations& activations);
  LayerActivations allocate_layer(Keep keep);
  // A set of the recomputation pool, and back; its buffers freed.
  LentSet borrow();
  void give_back(LentSet& set);
  void release(LentSet& set);
  // Where layer `l`'s MoE MLP keeps its buffers: its own in `a`, or those of `lent` where it does not
  // keep them (null in a dense layer).
  MoeMlpSaved* moe_buffers(std::size_t l, Activations& a, LentSet& lent);
  // Fills the buffers `act` does not keep with `from`'s.
  static void fill_missing(LayerActivations& act, const LayerActivations& from);
  // A branch's output not yet added to the residual stream, and the dropout it passes through
  // there (fused into the add: the next norm's, or the stage output's).
  struct PendingBranch {
    ConstActivation output = nullptr;
    DropoutMask dropout;
  };
  // One layer's forward: `stream` + dropout(`pending`) (none: `stream` alone) is its input,
  // written to act.input; on return `stream` is its middle and `pending` its MLP output (scratch_.branch_out).
  // `moe`: an MoE layer's MLP buffers (null in a dense layer).
  // `again`: full recomputation's forward, which adds nothing to the router losses or the expert
  // biases' counts (the first forward did).
  void layer_forward(std::size_t l, const LayerActivations& act, const std::optional<int64_t>& first_sample,
                     ConstActivation& stream, PendingBranch& pending, MoeMlpSaved* moe, bool again = false);
  // The mask of a dropout of layer `l` of the stage (the embedding's: any l) in the microbatch from
  // `first_sample`: this rank's rows (sequence parallelism) and heads (tensor parallelism) of the
  // whole model's tensor. Inactive where its rate is 0, and without a sample (evaluation).
  DropoutMask dropout_mask(DropoutKind kind, std::size_t l, const std::optional<int64_t>& first_sample) const;
  // Under --hidden-dropout, `gradient` (this rank's rows) through `mask` into scratch_.branch_out;
  // else `gradient`. masked_gradient: that, gathered over the tensor-parallel group under sequence
  // parallelism.
  ConstActivation masked_rows(ConstActivation gradient, const DropoutMask& mask);
  ConstActivation masked_gradient(ConstActivation gradient, const DropoutMask& mask);
  // An MoE layer's shared expert's input: scratch_.norm_out, gathered over the tp group when it has one.
  ConstActivation moe_shared_input();
  // One layer's backward from d_out (the gradient at its output) into d_out (at its input), via
  // d_middle; `deferred` non-null under I; an MoE layer's router losses' gradients times
  // `loss_scale`, as the LM loss's.
  void layer_backward(std::size_t l, const LayerActivations& act, const std::optional<int64_t>& first_sample,
                      Activation d_out, Activation d_middle, DeferredGradients* deferred, const MoeMlpSaved* moe,
                      MoeMlpDeferred* moe_deferred, float loss_scale);
  // The dense MLP's backward from d_out_full (the gradient at its output, gathered) into
  // scratch_.d_hidden (at the norm's output, summed over tp).
  void dense_mlp_backward(std::size_t l, const LayerActivations& act, ConstActivation d_out_full,
                          DeferredGradients* deferred);
  // Tensor parallelism's collectives on activations (no-ops when tp = 1). The full [tokens x
  // hidden] input of a column-parallel layer: `rows` itself, or under sequence parallelism all
  // ranks' rows gathered into `full`.
  ConstActivation gather_rows(ConstActivation rows, Activation full);
  // Where a row-parallel GEMM (or a column-parallel input gradient) writes its partial sum whose
  // reduce(destination) leaves the sum in `destination`: in place (all-reduce), or scratch_.partial
  // reduce-scattered into the rank's rows.
  Activation partial_of(Activation destination);
  Request reduce(Activation destination);
  // The model's norm (LayerNorm or RMSNorm; `beta` and `mean` unused by RMSNorm), as the backend's
  // layernorm_forward and layernorm_backward: of x alone, or of x + dropout(branch) written to sum_out.
  void norm_forward(ConstActivation x, const PendingBranch& branch, Activation sum_out, const Parameter* gamma,
                    const Parameter* beta, Activation y, float* mean, float* rstd);
  void norm_backward(ConstActivation dy, ConstActivation x, const Parameter* gamma, const Parameter* beta,
                     const float* mean, const float* rstd, ConstActivation residual_grad, Activation dx);
  // Attention of a layer whose qkv is in act.qkv, into act.attention and act.attention_saved: the
  // backend's over the whole sequence, or under context parallelism the ring's blocks (its
  // log-sum-exp kept); the backward from scratch_.d_hidden into scratch_.d_qkv.
  void attention_forward(std::size_t l, const LayerActivations& act, const std::optional<int64_t>& first_sample);
  void attention_backward(std::size_t l, const LayerActivations& act, const std::optional<int64_t>& first_sample);
  AttentionDims attention_dims() const;
  // Elements of the rank's packed keys and values (Backend::pack_key_values), what a ring step sends.
  std::size_t key_value_elements() const { return width_.tokens * (width_.qkv - width_.query); }
  // One exchange of the ring: `out` (key_value_elements() of them) sent to the next rank and the
  // previous rank's received into `in`, as one operation (Comm::send_recv).
  Request pass_on(ConstActivation out, Activation in);
  // run(block) for each block of the ring's step `step` on this rank, placed in the sequence.
  template <typename Run>
  void for_each_ring_block(int64_t step, const Run& run) const;
  // The rotary embedding on a fused qkv (or back, on its gradient); nothing without RoPE.
  void rotate(Activation qkv, bool inverse);
  // Tokens and labels of a microbatch into `a`, checked against the vocabulary.
  void read_tokens(Activations& a, const MicrobatchTokens& data) const;
  // REQUIRES: a.layers[0].input holds the stage input on a non-first stage.
  void run_forward(Activations& activations, const MicrobatchTokens* data, std::optional<int64_t> first_sample);
  // The deferred weight gradients of one microbatch: the output layer's, each layer's from the
  // last (layer_weight_gradients: from the output gradients I kept, the norms recomputed), the
  // embedding's.
  void weight_gradients(Activations& a);
  // `moe`, `moe_kept`: an MoE layer's MLP's buffers and what I kept of it (null in a dense layer).
  void layer_weight_gradients(std::size_t l, const LayerActivations& act, const DeferredGradients& kept,
                              const MoeMlpSaved* moe, const MoeMlpDeferred* moe_kept);
  // Under B a GEMM's weight gradient taken now; under I (`keep` not null) its output gradient copied
  // out of the scratch buffers the loop reuses, kept for W. A row-parallel bias's gradient comes
  // from the whole output gradient, so every rank holds the same one.
  void weight_gradient_or_keep(ConstActivation dy, ConstActivation x, std::size_t k, std::size_t n, Parameter* weight,
                               Parameter* bias, Activation* keep);
  // A linear layer's weight (and bias) gradient from its output gradient and input, accumulated.
  void accumulate_weight_gradient(ConstActivation dy, ConstActivation x, std::size_t k, std::size_t n,
                                  Parameter* weight, Parameter* bias);
  Activations take(std::map<int64_t, Activations>& from, int64_t microbatch, const char* why);

  Backend& backend_;
  // The decoder layer on this rank (core/layer_recipe.h): widths, choices, buffers.
  const LayerRecipe recipe_;
  // The recipe's widths, in the unsigned type the Backend takes: a microbatch's sequences and
  // their length, the GEMMs' rows (tokens) and the stream's (rows: split over tp under sequence
  // parallelism); this rank's query heads and key-value groups (and query heads per group), QKV's
  // and fc1's outputs, the MLP's width and the vocabulary rows from vocabulary_start; the padded
  // vocabulary whole.
  struct Widths {
    std::size_t batch, seq, tokens, rows, hidden, query, qkv, ffn, fc1, heads, groups, group_heads, head_dim,
        rotary_dim, vocabulary, vocabulary_start, padded_vocabulary;
  };
  const Widths width_;
  static Widths widths(const LayerRecipe& recipe, int64_t tp, int64_t tp_rank);
  int64_t stage_, layers_total_, first_layer_;
  bool untied_;  // biases: the parameters the model has (Layer's non-null ones)
  RotaryFrequencies rotary_;
  float norm_epsilon_;
  // Dropout: --hidden-dropout, --attention-dropout, and --seed, which draws their masks.
  double hidden_dropout_, attention_dropout_;
  uint64_t seed_;
  // Tensor parallelism: the group (null when tp = 1) and this rank.
  Comm* tensor_parallel_;
  int64_t tp_rank_;
  // Context parallelism: the group (null when cp = 1), and where the rank's tokens of a sequence lie.
  Comm* context_parallel_;
  TokenPlaces places_;
  DType activation_type_;
  bool has_embedding_, has_output_;
  std::vector<Parameter> parameters_;
  ParameterLayout layout_;
  float* values_ = nullptr;
  float* gradients_ = nullptr;
  Parameter* word_embeddings_ = nullptr;
  Parameter* position_embeddings_ = nullptr;
  Parameter* output_copy_ = nullptr;    // the tied output weight's own copy on a later rank
  Parameter* output_weight_ = nullptr;  // what the output layer reads: one of the above or tied_embedding
  Parameter* final_gamma_ = nullptr;
  Parameter* final_beta_ = nullptr;
  std::vector<Layer> layers_;
  GradientProgress gradient_progress_;              // null: nobody listens
  std::map<int64_t, Activations> in_flight_;        // by microbatch, from F (or input_buffer) until B or I
  std::map<int64_t, Activations> awaiting_weight_;  // from I until W
  std::vector<Activations> spare_;                  // released activations, reused
  std::vector<Keep> keep_;                          // by layer of the stage
  std::vector<LayerGroup> groups_;                  // core's recomputation groups of the stage
  std::vector<LentSet> pool_;                       // the recomputation pool, reused
  bool lent_moe_ = false;                           // its sets hold an MoE MLP's buffers (LentSet)
  Scratch scratch_;                                 // the recipe's scratch: see core/layer_recipe.h
  std::unique_ptr<MoeMlp> moe_;                     // the MoE layers' MLP, with its scratch (null: none)
  ExpertBiases expert_biases_;
  // Tells gradient_progress_ that every parameter from `first` on holds this microbatch's gradient.
  void gradients_done_from(const Parameter* first);
  // The loss's memory (scratch_.loss_memory): the running loss sum (a double, first for its
  // alignment), then the row statistics [lse_s | target logit | peak] of vocabulary_parallel_loss.h.
  double* loss_sum_ = nullptr;
  float* statistics_ = nullptr;
};

}  // namespace megaplan::exec
