#include "executor/model/stage_chunk.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <stdexcept>

#include "core/context_parallel.h"
#include "core/error.h"
#include "core/executor_support.h"
#include "core/fnv1a.h"
#include "core/formulas.h"
#include "core/pipeline_layout.h"
#include "executor/model/recipe_buffers.h"
#include "executor/model/vocabulary_parallel_loss.h"
#include "executor/runtime/backend.h"

namespace megaplan::exec {

namespace {

// The running loss sum's floats at the head of the loss memory (core/layer_recipe.h).
constexpr auto kLossSum = static_cast<std::size_t>(kLossSumFloats);

// A parameter's key for its draws (kernels/normal_draws.h): FNV-1a of its name (not std::hash,
// which differs between standard libraries), from a tenth of FNV's offset basis. The basis is a
// slip kept on purpose: every run's initial weights, and so every recorded loss, derive from it.
uint64_t name_hash(const std::string& name) { return Fnv1a64(1469598103934665603ull).add(name).value(); }

// Under I, where a GEMM's output gradient waits for W (`deferred`'s field); null under B.
Activation* kept_for_w(DeferredGradients<Activation>* deferred, Activation DeferredGradients<Activation>::*field) {
  return deferred ? &(deferred->*field) : nullptr;
}

// An MoE layer's MLP as core's recipe sizes it and core/moe_spec.h configures its router.
MoeMlpShape moe_mlp_shape(const ModelSpec& model, const LayerRecipe& recipe) {
  const MoeSpec& spec = model.moe;
  const MoeDims& dims = *recipe.moe;
  const auto size = [](int64_t n) { return static_cast<std::size_t>(n); };
  MoeMlpShape shape;
  shape.tokens = size(dims.tokens);
  shape.hidden = size(dims.hidden);
  shape.ffn = size(dims.ffn);
  shape.shared_ffn = size(dims.shared_ffn);
  shape.shared_gate = dims.shared_gate;
  shape.router.experts = size(dims.experts);
  shape.router.topk = size(dims.topk);
  shape.router.sigmoid = spec.score_function == RouterScoreFunction::kSigmoid;
  shape.router.pre_softmax = spec.router_pre_softmax;
  shape.router.scaling_factor = static_cast<float>(spec.router_topk_scaling_factor.value_or(1.0));
  if (spec.expert_capacity_factor) {
    shape.capacity.capacity = size(dims.capacity);
    shape.capacity.policy =
        spec.token_drop_policy == TokenDropPolicy::kProbs ? MoeDropPolicy::kProbs : MoeDropPolicy::kPosition;
    shape.capacity.pad = spec.pad_expert_input_to_capacity;
  }
  if (dims.aux_loss) shape.aux_loss_coeff = spec.aux_loss_coeff;
  shape.aux_loss_sequences = size(dims.aux_loss_sequences);
  if (dims.z_loss) shape.z_loss_coeff = spec.z_loss_coeff;
  return shape;
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void StageChunk::refuse_unsupported(const ModelSpec& model, const ParallelPlan& plan) {
  if (std::optional<SpecError> refusal = executor_model_refusal(model)) throw *refusal;
  if (std::optional<SpecError> refusal = executor_plan_refusal(plan)) throw *refusal;
  if (std::optional<SpecError> refusal = executor_moe_refusal(model, plan)) throw *refusal;
}

TensorCut tensor_cut(const ParameterSpec& spec) {
  switch (spec.split) {
    case TensorSplit::kColumn:
    case TensorSplit::kVocabulary: return {0, spec.shard_index, spec.shard_count, spec.chunks};
    case TensorSplit::kRow: return {1, spec.shard_index, spec.shard_count};
    case TensorSplit::kReplicated: break;
  }
  return {};
}

StageChunk::Widths StageChunk::widths(const LayerRecipe& recipe, int64_t tp, int64_t tp_rank) {
  const LayerDims& d = recipe.dims;
  const auto size = [](int64_t n) { return static_cast<std::size_t>(n); };
  return {size(recipe.micro_batch_size),
          size(recipe.seq_length / recipe.context_parallel),
          size(d.tokens),
          size(d.rows),
          size(d.hidden),
          size(d.query),
          size(d.qkv),
          size(d.ffn),
          size(d.fc1),
          size(d.heads),
          size(d.groups),
          size(d.heads / d.groups),
          size(d.head_dim),
          size(recipe.rotary_dim),
          size(d.vocabulary),
          size(tp_rank * d.vocabulary),
          size(tp * d.vocabulary)};
}

template <typename Sizes, typename Buffers>
void StageChunk::allocate(const Sizes& sizes, Buffers& buffers) {
  allocate_buffers(backend_, sizes, buffers);
}

template <typename Buffers>
void StageChunk::release(Buffers& buffers) {
  release_buffers(backend_, buffers);
}

void StageChunk::add_parameter(const ParameterSpec& spec) {
  Parameter parameter;
  static_cast<ParameterSpec&>(parameter) = spec;
  const std::size_t index = parameters_.size();
  parameter.value = values_ + layout_.offsets[index];
  parameter.gradient = gradients_ + layout_.offsets[index];
  parameter.compute = backend_.compute_copy(parameter.value, parameter.size);
  parameters_.push_back(std::move(parameter));
}

StageChunk::StageChunk(const ModelSpec& model, const ParallelPlan& plan, int64_t stage, Backend& backend,
                       const Initialisation& init, Parameter* tied_embedding, Comm* tensor_parallel,
                       std::size_t bucket_size, Comm* context_parallel, Comm* expert_parallel,
                       std::optional<Comm*> expert_tensor_parallel)
    : backend_(backend),
      recipe_(model, plan, executor_precision(backend)),
      width_(widths(recipe_, plan.tensor_parallel_size, tensor_parallel ? tensor_parallel->rank() : 0)),
      stage_(stage),
      layers_total_(model.num_layers),
      untied_(model.untie_embeddings_and_output_weights),
      rotary_(model.rotary_base, model.rope_scaling),
      norm_epsilon_(static_cast<float>(model.norm_epsilon)),
      hidden_dropout_(plan.options.hidden_dropout),
      attention_dropout_(plan.options.attention_dropout),
      seed_(init.seed),
      tensor_parallel_(tensor_parallel),
      tp_rank_(tensor_parallel ? tensor_parallel->rank() : 0),
      context_parallel_(context_parallel),
      activation_type_(backend.activation_type()) {
  refuse_unsupported(model, plan);
  const int64_t tp = plan.tensor_parallel_size, cp = plan.context_parallel_size;
  if ((tp > 1) != (tensor_parallel != nullptr) || (tensor_parallel && tensor_parallel->size() != tp)) {
    throw std::logic_error("StageChunk: the tensor-parallel group does not match the plan's tp");
  }
  if ((cp > 1) != (context_parallel != nullptr) || (context_parallel && context_parallel->size() != cp)) {
    throw std::logic_error("StageChunk: the context-parallel group does not match the plan's cp");
  }
  const int64_t ep = plan.expert_model_parallel_size;
  if ((ep > 1) != (expert_parallel != nullptr) || (expert_parallel && expert_parallel->size() != ep)) {
    throw std::logic_error("StageChunk: the expert-parallel group does not match the plan's ep");
  }
  const int64_t ep_rank = expert_parallel ? expert_parallel->rank() : 0;
  // The routed experts' cut: the tp group's (unset), or a group of the plan's etp (null at 1).
  const int64_t etp = plan.expert_tensor_parallel();
  Comm* const expert_tensor = expert_tensor_parallel.value_or(tensor_parallel);
  if ((etp > 1) != (expert_tensor != nullptr) || (expert_tensor && expert_tensor->size() != etp) ||
      (!expert_tensor_parallel && etp != tp)) {
    throw std::logic_error("StageChunk: the expert tensor-parallel group does not match the plan's etp");
  }
  const int64_t etp_rank = expert_tensor ? expert_tensor->rank() : 0;
  if (context_parallel) {
    const std::array<int64_t, 2> chunks = context_chunks(context_parallel->rank(), cp);
    places_ = {recipe_.seq_length / (2 * cp), chunks[0], chunks[1]};
  }
  if (plan.micro_batch_size <= 0) throw SpecError("--micro-batch-size", "must be a positive integer");
  const StageLayers stage_layout = stage_layers(stage, model, plan);
  first_layer_ = stage_layout.first_layer;
  has_embedding_ = stage_layout.has_embedding;
  has_output_ = stage_layout.has_output_layer;
  groups_ = recompute_groups(plan, stage_layout.num_layers);
  keep_ = layer_keeps(plan, groups_);
  lent_moe_ = lent_sets_hold_moe(model, first_layer_, keep_);

  const std::vector<ParameterSpec> specs = describe_parameters(model, plan, stage, tp_rank_, ep_rank, etp_rank);
  layout_ = megaplan::stage_layout(model, plan, stage, bucket_size);
  values_ = backend_.allocate(layout_.total);
  gradients_ = backend_.allocate(layout_.total);
  parameters_.reserve(specs.size());  // pointers into it stay valid
  for (const ParameterSpec& spec : specs) add_parameter(spec);

  // By Megatron's names (core's parameter list holds only what the architecture has).
  std::map<std::string, Parameter*> by_name;
  for (Parameter& parameter : parameters_) by_name[parameter.name] = &parameter;
  const auto find = [&](const std::string& name) -> Parameter* {
    const auto found = by_name.find(name);
    return found == by_name.end() ? nullptr : found->second;
  };
  if (has_embedding_) {
    word_embeddings_ = find(kWordEmbeddings);
    position_embeddings_ = find("embedding.position_embeddings.weight");
  }
  for (int64_t l = 0; l < stage_layout.num_layers; ++l) {
    const std::string prefix = "decoder.layers." + std::to_string(first_layer_ + l) + ".";
    Layer& layer = layers_.emplace_back(Layer{find(prefix + "input_layernorm.weight"),
                                              find(prefix + "input_layernorm.bias"),
                                              find(prefix + "self_attention.linear_qkv.weight"),
                                              find(prefix + "self_attention.linear_qkv.bias"),
                                              find(prefix + "self_attention.linear_proj.weight"),
                                              find(prefix + "self_attention.linear_proj.bias"),
                                              find(prefix + "pre_mlp_layernorm.weight"),
                                              find(prefix + "pre_mlp_layernorm.bias"),
                                              find(prefix + "mlp.linear_fc1.weight"),
                                              find(prefix + "mlp.linear_fc1.bias"),
                                              find(prefix + "mlp.linear_fc2.weight"),
                                              find(prefix + "mlp.linear_fc2.bias"),
                                              /*moe=*/false,
                                              nullptr,
                                              {},
                                              {},
                                              nullptr,
                                              nullptr,
                                              nullptr,
                                              0,
                                              find(prefix + "self_attention.q_layernorm.weight"),
                                              find(prefix + "self_attention.k_layernorm.weight")});
    if (!model.moe.moe_layer(first_layer_ + l)) continue;
    layer.moe = true;
    layer.router = find(prefix + "mlp.router.weight");
    const int64_t local = model.moe.num_experts / ep;  // the ep rank's experts
    for (int64_t e = ep_rank * local; e < (ep_rank + 1) * local; ++e) {
      const std::string expert = prefix + "mlp.experts.local_experts." + std::to_string(e) + ".";
      layer.expert_fc1.push_back(find(expert + "linear_fc1.weight"));
      layer.expert_fc2.push_back(find(expert + "linear_fc2.weight"));
    }
    layer.shared_fc1 = find(prefix + "mlp.shared_experts.linear_fc1.weight");
    layer.shared_fc2 = find(prefix + "mlp.shared_experts.linear_fc2.weight");
    layer.shared_gate = find(prefix + "mlp.shared_experts.gate_weight");
    if (!moe_) {
      moe_ = std::make_unique<MoeMlp>(moe_mlp_shape(model, recipe_), backend_, expert_parallel, tensor_parallel,
                                      context_parallel, expert_tensor);
    }
    if (model.moe.router_enable_expert_bias) {
      layer.expert_bias = expert_biases_.layers.size();
      expert_biases_.layers.push_back(first_layer_ + l);
    }
  }
  if (!expert_biases_.layers.empty()) {
    ExpertBiases& biases = expert_biases_;
    biases.experts = static_cast<std::size_t>(model.moe.num_experts);
    const std::size_t n = biases.layers.size() * biases.experts;
    biases.biases = backend_.allocate(n);
    backend_.fill(biases.biases, n, 0.0f);
    biases.counts = backend_.allocate(n);
    biases.routed.assign(n, 0);
  }
  if (has_output_) {
    final_gamma_ = find("decoder.final_layernorm.weight");
    final_beta_ = find("decoder.final_layernorm.bias");
    Parameter* own = find(kOutputWeight);
    if (!untied_) output_copy_ = own;
    output_weight_ = own ? own : word_embeddings_ ? word_embeddings_ : tied_embedding;
    if (!output_weight_)
      throw std::logic_error("StageChunk: the last stage needs stage 0's word embedding on its rank");
  }
  initialise(init);

  allocate(recipe_.scratch(has_output_), scratch_);
  if (has_output_) {
    loss_sum_ = reinterpret_cast<double*>(scratch_.loss_memory);  // allocations are at least 16-byte aligned
    statistics_ = scratch_.loss_memory + kLossSum;
  }
}

void StageChunk::initialise(const Initialisation& init) {
  // Megatron's initialisation: normal(0, --init-method-std), output projections scaled by
  // 1 / sqrt(2 L). The output layer's copy draws the word embedding's values: the two start equal,
  // as Megatron makes them by broadcasting the first stage's. Each rank draws its part only, on the
  // backend: the elements of the whole tensor the single-rank run draws (kernels/normal_draws.h).
  const double sigma = init.init_method_std;
  const double output_sigma = sigma / std::sqrt(2.0 * static_cast<double>(layers_total_));
  for (Parameter& parameter : parameters_) {
    if (ends_with(parameter.name, "layernorm.weight")) {
      backend_.fill(parameter.value, parameter.size, 1.0f);
    } else if (!ends_with(parameter.name, "bias")) {  // biases keep allocate()'s zeros
      const bool output =
          ends_with(parameter.name, "linear_proj.weight") || ends_with(parameter.name, "linear_fc2.weight");
      // The tied copy draws the word embedding's values; an untied output layer its own.
      const std::string& source = &parameter == output_copy_ ? std::string(kWordEmbeddings) : parameter.name;
      const NormalDraws draws{init.seed, name_hash(source), output ? output_sigma : sigma,
                              part_placement(parameter.global_shape, tensor_cut(parameter))};
      backend_.draw_normal(parameter.value, parameter.size, draws);
    }
  }
  refresh_compute_weights();
  zero_gradients();
}

StageChunk::~StageChunk() {
  for (auto* held : {&in_flight_, &awaiting_weight_}) {
    for (auto& [microbatch, activations] : *held) release_activations(activations);
  }
  for (Activations& activations : spare_) release_activations(activations);
  for (LentSet& set : pool_) release(set);
  for (Parameter& parameter : parameters_) backend_.release_compute_copy(parameter.compute, parameter.value);
  backend_.release(values_);
  backend_.release(gradients_);
  if (expert_biases_.biases) {
    backend_.release(expert_biases_.biases);
    backend_.release(expert_biases_.counts);
  }
  release(scratch_);
}

void StageChunk::refresh_compute_weights() {
  for (Parameter& p : parameters_) backend_.refresh_compute_copy(p.value, p.size, p.compute);
}

void StageChunk::zero_gradients() { backend_.fill(gradients_, layout_.total, 0.0f); }

StageChunk::LayerActivations StageChunk::allocate_layer(Keep keep) {
  LayerActivations layer;
  allocate(recipe_.kept(keep), layer);
  return layer;
}

StageChunk::LentSet StageChunk::borrow() {
  if (pool_.empty()) return {allocate_layer(Keep::kAll), lent_moe_ ? moe_->allocate_saved() : MoeMlpSaved{}};
  LentSet set = std::move(pool_.back());
  pool_.pop_back();
  return set;
}

void StageChunk::release(LentSet& set) {
  release(set.layer);
  if (moe_) moe_->release(set.moe);
}

void StageChunk::give_back(LentSet& set) {
  pool_.push_back(std::move(set));
  set = LentSet{};
}

MoeMlpSaved* StageChunk::moe_buffers(std::size_t l, Activations& a, LentSet& lent) {
  if (!layers_[l].moe) return nullptr;
  return keeps_moe_buffers(keep_[l]) ? &a.moe[l] : &lent.moe;
}

StageChunk::Activations StageChunk::allocate_activations() {
  if (!spare_.empty()) {
    Activations reused = std::move(spare_.back());
    spare_.pop_back();
    return reused;
  }
  Activations a;
  for (std::size_t l = 0; l < keep_.size(); ++l) {
    LayerActivations layer;
    allocate(recipe_.kept(keep_[l], layers_[l].moe), layer);
    a.layers.push_back(layer);
    a.moe.push_back(layers_[l].moe && keeps_moe_buffers(keep_[l]) ? moe_->allocate_saved() : MoeMlpSaved{});
  }
  allocate(recipe_.microbatch(has_output_), a.head);
  return a;
}

void StageChunk::release_activations(Activations& a) {
  for (LayerActivations& l : a.layers) release(l);
  for (MoeMlpSaved& moe : a.moe) {
    if (moe_) moe_->release(moe);
  }
  for (LentSet& set : a.borrowed) release(set);
  for (DeferredGradients& d : a.deferred) release(d);
  for (MoeMlpDeferred& d : a.moe_deferred) {
    if (moe_) moe_->release(d);
  }
  release(a.head);
  if (a.input_gradient) backend_.release(a.input_gradient);
  a.input_gradient = nullptr;
  a.layers.clear();
  a.moe.clear();
  a.borrowed.clear();
  a.deferred.clear();
  a.moe_deferred.clear();
}

void StageChunk::read_tokens(Activations& a, const MicrobatchTokens& data) const {
  // The whole sequences; the rank takes its tokens of each (all of them, or two chunks under
  // context parallelism).
  const std::size_t batch = width_.batch, whole = static_cast<std::size_t>(recipe_.seq_length), seq = width_.seq,
                    count = width_.tokens;
  if (data.tokens.size() != batch * (whole + 1) || data.loss_mask.size() != batch * whole) {
    throw SpecError("--micro-batch-size", "a microbatch needs " + std::to_string(batch * (whole + 1)) +
                                              " tokens, got " + std::to_string(data.tokens.size()));
  }
  // Each token's share of the microbatch's loss: its mask over the masked tokens of the whole
  // sequences, so that the context-parallel ranks' losses add up to the single rank's.
  double masked = 0;
  for (const float m : data.loss_mask) masked += m;
  a.inputs.resize(count);
  a.labels.resize(count);
  a.weights.resize(count);
  for (std::size_t b = 0; b < batch; ++b) {
    for (std::size_t t = 0; t < seq; ++t) {
      const auto s = static_cast<std::size_t>(places_.place(static_cast<int64_t>(t)));
      const int64_t input = data.tokens[b * (whole + 1) + s];
      const int64_t label = data.tokens[b * (whole + 1) + s + 1];
      const auto vocabulary = static_cast<int64_t>(width_.padded_vocabulary);
      if (input < 0 || input >= vocabulary || label < 0 || label >= vocabulary) {
        throw SpecError("--data-path", "token " + std::to_string(std::max(input, label)) +
                                           " is outside the model's padded vocabulary of " +
                                           std::to_string(vocabulary));
      }
      a.inputs[b * seq + t] = input;
      a.labels[b * seq + t] = label;
      a.weights[b * seq + t] = masked > 0 ? static_cast<float>(data.loss_mask[b * whole + s] / masked) : 0.0f;
    }
  }
}

void StageChunk::run_forward(Activations& a, const MicrobatchTokens* data, std::optional<int64_t> first_sample) {
  if ((has_embedding_ || has_output_) && !data)
    throw std::logic_error("StageChunk: the first and last stages read data");
  if (data) read_tokens(a, *data);
  a.first_sample = first_sample;
  const std::size_t seq = width_.seq, count = width_.tokens, rows = width_.rows, h = width_.hidden,
                    v = width_.vocabulary;
  // The residual stream: x_{l+1} = middle_l + mlp(ln2(middle_l)), middle_l = x_l + attention(ln1(x_l)).
  // Each branch's output waits in scratch_.branch_out until the next norm adds it to the stream. A
  // non-first stage's input is already in the first layer's input (or, without layers, the output).
  Activation first_input = a.layers.empty() ? a.head.output : a.layers[0].input;
  if (has_embedding_) {
    // Vocabulary-parallel: each rank looks up its rows' tokens; the sum over the group is the embedding.
    backend_.embedding_forward(a.inputs.data(), count, seq, word_embeddings_->compute, width_.vocabulary_start, v,
                               tp_rank_ == 0 && position_embeddings_ ? position_embeddings_->compute : nullptr, h,
                               partial_of(first_input), places_);
    if (Request done = reduce(first_input)) done->wait();
    const DropoutMask mask = dropout_mask(DropoutKind::kEmbedding, 0, first_sample);
    if (mask.active()) backend_.dropout(first_input, nullptr, rows, h, mask, first_input);
  }
  ConstActivation stream = first_input;
  PendingBranch pending;  // the branch output not yet added to `stream`
  // Layers that keep less than everything run on one borrowed set, which each layer's first norm
  // has read before the next layer writes it.
  LentSet scratch;
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    LayerActivations act = a.layers[l];
    if (keep_[l] != Keep::kAll) {
      if (!scratch.layer.qkv) scratch = borrow();
      fill_missing(act, scratch.layer);
    }
    layer_forward(l, act, first_sample, stream, pending, moe_buffers(l, a, scratch));
  }
  if (!has_output_) {
    // The message to the next stage is the residual sum itself.
    if (pending.dropout.active()) {
      backend_.dropout(pending.output, stream, rows, h, pending.dropout, a.head.output);
    } else if (pending.output) {
      backend_.add(stream, pending.output, rows * h, a.head.output);
    }
    if (scratch.layer.qkv) give_back(scratch);
    return;
  }
  Activation normed = recipe_.sequence_parallel ? scratch_.norm_out : a.head.final_norm;
  norm_forward(stream, pending, pending.output ? a.head.output : nullptr, final_gamma_, final_beta_, normed,
               a.head.final_mean, a.head.final_rstd);
  gather_rows(normed, a.head.final_norm);
  if (scratch.layer.qkv) give_back(scratch);
  // The output layer (tied: the word embedding E): logits = final_norm E^T over the rank's vocabulary rows.
  backend_.linear_forward(a.head.final_norm, output_weight_->compute, nullptr, count, h, v, GemmEpilogue::kNone,
                          a.head.logits, nullptr);
  backend_.cross_entropy_statistics(a.head.logits, a.labels.data(), count, v, width_.vocabulary_start, statistics_,
                                    statistics_ + count, tensor_parallel_ ? statistics_ + 2 * count : nullptr);
  vocabulary_parallel_cross_entropy(backend_, tensor_parallel_, statistics_, a.weights.data(), count, a.head.loss_saved,
                                    loss_sum_);
}

RouterLosses StageChunk::take_router_losses() { return moe_ ? moe_->take_losses() : RouterLosses{}; }

MoeMlpWeights StageChunk::moe_weights(const Layer& layer) {
  const auto compute = [](const Parameter* p) -> ConstActivation { return p ? p->compute : nullptr; };
  MoeMlpWeights weights{compute(layer.router),     {}, {}, compute(layer.shared_fc1), compute(layer.shared_fc2),
                        compute(layer.shared_gate)};
  for (const Parameter* p : layer.expert_fc1) weights.fc1.push_back(p->compute);
  for (const Parameter* p : layer.expert_fc2) weights.fc2.push_back(p->compute);
  return weights;
}

MoeMlpGradients StageChunk::moe_gradients(const Layer& layer) {
  const auto gradient = [](const Parameter* p) { return p ? p->gradient : nullptr; };
  MoeMlpGradients gradients{gradient(layer.router),     {}, {}, gradient(layer.shared_fc1), gradient(layer.shared_fc2),
                            gradient(layer.shared_gate)};
  for (const Parameter* p : layer.expert_fc1) gradients.fc1.push_back(p->gradient);
  for (const Parameter* p : layer.expert_fc2) gradients.fc2.push_back(p->gradient);
  return gradients;
}

double StageChunk::take_loss_sum() {
  if (!has_output_) throw std::logic_error("StageChunk: take_loss_sum on a stage without the loss");
  float words[kLossSum];
  backend_.download(words, scratch_.loss_memory, kLossSum);
  double sum = 0;
  std::memcpy(&sum, words, sizeof sum);
  const float zero[kLossSum] = {};
  backend_.upload(scratch_.loss_memory, zero, kLossSum);
  return sum;
}

ConstActivation StageChunk::gather_rows(ConstActivation rows, Activation full) {
  if (!recipe_.sequence_parallel) return rows;
  tensor_parallel_->all_gather(rows, full, width_.rows * width_.hidden, activation_type_)->wait();
  return full;
}

Activation StageChunk::partial_of(Activation destination) {
  return recipe_.sequence_parallel ? scratch_.partial : destination;
}

Request StageChunk::reduce(Activation destination) {
  if (!tensor_parallel_) return nullptr;
  if (recipe_.sequence_parallel) {
    return tensor_parallel_->reduce_scatter(scratch_.partial, destination, width_.rows * width_.hidden,
                                            activation_type_, ReduceOp::kSum);
  }
  return tensor_parallel_->all_reduce(destination, width_.rows * width_.hidden, activation_type_, ReduceOp::kSum);
}

void StageChunk::reduce_replicated_gradients(std::size_t first, std::size_t last) {
  if (!tensor_parallel_) return;
  const bool rows = recipe_.sequence_parallel;
  std::vector<Parameter*> norms;
  for (const Layer& layer : layers_) {
    if (rows) norms.insert(norms.end(), {layer.ln1_gamma, layer.ln1_beta, layer.ln2_gamma, layer.ln2_beta});
    // An MoE layer's router and shared gate, whole on every tp rank, each summed over its rows.
    if (rows && layer.moe) norms.insert(norms.end(), {layer.router, layer.shared_gate});
    norms.insert(norms.end(), {layer.q_norm, layer.k_norm});
  }
  if (rows && has_output_) norms.insert(norms.end(), {final_gamma_, final_beta_});
  std::vector<Request> pending;
  for (Parameter* norm : norms) {
    if (!norm) continue;  // RMSNorm has no bias; a model without --qk-layernorm no query and key norms
    const auto index = static_cast<std::size_t>(norm - parameters_.data());
    if (index < first || index > last) continue;
    pending.push_back(tensor_parallel_->all_reduce(norm->gradient, norm->size, DType::kFloat32, ReduceOp::kSum));
  }
  for (Request& request : pending) request->wait();
}

void StageChunk::gradients_done_from(const Parameter* first) {
  if (gradient_progress_) gradient_progress_(static_cast<std::size_t>(first - parameters_.data()));
}

Activation StageChunk::input_buffer(int64_t microbatch) {
  if (has_embedding_) throw std::logic_error("StageChunk: the first stage reads tokens, not an input buffer");
  auto found = in_flight_.find(microbatch);
  if (found == in_flight_.end()) found = in_flight_.emplace(microbatch, allocate_activations()).first;
  Activations& a = found->second;
  return a.layers.empty() ? a.head.output : a.layers[0].input;
}

void StageChunk::forward(int64_t microbatch, const MicrobatchTokens* data, int64_t first_sample) {
  auto found = in_flight_.find(microbatch);
  if (found == in_flight_.end()) {
    if (!has_embedding_) throw std::logic_error("StageChunk: F of a non-first stage before its input arrived");
    found = in_flight_.emplace(microbatch, allocate_activations()).first;
  }
  run_forward(found->second, data, first_sample);
}

ConstActivation StageChunk::output(int64_t microbatch) const {
  const auto found = in_flight_.find(microbatch);
  if (found == in_flight_.end() || has_output_) throw std::logic_error("StageChunk::output without its forward");
  return found->second.head.output;
}

double StageChunk::evaluate(const MicrobatchTokens* data, ConstActivation input, Activation output) {
  Activations a = allocate_activations();
  const std::size_t n = message_size();
  if (!has_embedding_) backend_.copy(input, n, a.layers.empty() ? a.head.output : a.layers[0].input);
  run_forward(a, data, std::nullopt);
  if (!has_output_) backend_.copy(a.head.output, n, output);
  spare_.push_back(std::move(a));
  return has_output_ ? take_loss_sum() : 0.0;
}

StageChunk::Activations StageChunk::take(std::map<int64_t, Activations>& from, int64_t microbatch, const char* why) {
  const auto found = from.find(microbatch);
  if (found == from.end()) throw std::logic_error(std::string("StageChunk: ") + why);
  Activations a = std::move(found->second);
  from.erase(found);
  return a;
}

void StageChunk::fill_missing(LayerActivations& act, const LayerActivations& from) {
  for_each_buffer(act, from, [](auto& field, auto source) {
    if (!field) field = source;
  });
}

void StageChunk::norm_forward(ConstActivation x, const PendingBranch& branch, Activation sum_out,
                              const Parameter* gamma, const Parameter* beta, Activation y, float* mean, float* rstd) {
  const std::size_t rows = width_.rows, h = width_.hidden;
  if (recipe_.rms_norm) {
    backend_.rmsnorm_forward(x, branch.output, branch.dropout, sum_out, gamma->compute, rows, h, norm_epsilon_, y,
                             rstd);
  } else {
    backend_.layernorm_forward(x, branch.output, branch.dropout, sum_out, gamma->compute, beta->compute, rows, h, y,
                               mean, rstd);
  }
}

void StageChunk::norm_backward(ConstActivation dy, ConstActivation x, const Parameter* gamma, const Parameter* beta,
                               const float* mean, const float* rstd, ConstActivation residual_grad, Activation dx) {
  const std::size_t rows = width_.rows, h = width_.hidden;
  if (recipe_.rms_norm) {
    backend_.rmsnorm_backward(dy, x, gamma->compute, rstd, rows, h, residual_grad, dx, gamma->gradient);
  } else {
    backend_.layernorm_backward(dy, x, gamma->compute, mean, rstd, rows, h, residual_grad, dx, gamma->gradient,
                                beta->gradient);
  }
}

void StageChunk::rotate(Activation qkv, bool inverse) {
  if (!recipe_.rope) return;
  backend_.rotary(qkv, width_.batch, width_.seq, width_.groups, width_.group_heads, width_.head_dim, width_.rotary_dim,
                  rotary_, inverse, places_);
}

DropoutMask StageChunk::dropout_mask(DropoutKind kind, std::size_t l,
                                     const std::optional<int64_t>& first_sample) const {
  DropoutMask mask;
  if (!first_sample) return mask;
  mask.probability =
      static_cast<float>(kind == DropoutKind::kAttentionProbabilities ? attention_dropout_ : hidden_dropout_);
  mask.seed = seed_;
  mask.site = dropout_site(first_layer_ + static_cast<int64_t>(l), kind);
  mask.first_sample = *first_sample;
  mask.seq = recipe_.seq_length;
  mask.places = places_;
  mask.first_row = recipe_.sequence_parallel ? tp_rank_ * recipe_.dims.rows : 0;
  mask.first_head = tp_rank_ * recipe_.dims.heads;
  return mask;
}

ConstActivation StageChunk::masked_rows(ConstActivation gradient, const DropoutMask& mask) {
  if (!mask.active()) return gradient;
  backend_.dropout(gradient, nullptr, width_.rows, width_.hidden, mask, scratch_.branch_out);
  return scratch_.branch_out;
}

ConstActivation StageChunk::masked_gradient(ConstActivation gradient, const DropoutMask& mask) {
  return gather_rows(masked_rows(gradient, mask), scratch_.gathered);
}

ConstActivation StageChunk::moe_shared_input() {
  const bool gathered = tensor_parallel_ && moe_->shape().shared_ffn > 0;
  return gathered ? gather_rows(scratch_.norm_out, scratch_.gathered) : scratch_.norm_out;
}

AttentionDims StageChunk::attention_dims() const {
  return {width_.batch, width_.seq, width_.heads, width_.groups, width_.head_dim};
}

Request StageChunk::pass_on(ConstActivation out, Activation in) {
  const int64_t cp = context_parallel_->size(), rank = context_parallel_->rank();
  return context_parallel_->send_recv(out, (rank + 1) % cp, in, (rank + cp - 1) % cp, key_value_elements(),
                                      activation_type_);
}

void StageChunk::attention_forward(std::size_t l, const LayerActivations& act,
                                   const std::optional<int64_t>& first_sample) {
  const DropoutMask dropout = dropout_mask(DropoutKind::kAttentionProbabilities, l, first_sample);
  if (!context_parallel_) {
    backend_.attention_forward(act.qkv, width_.batch, width_.seq, width_.heads, width_.groups, width_.head_dim, dropout,
                               act.attention, act.attention_saved);
    return;
  }
  // The ring: each step sends the keys and values in hand on to the next rank while attending to
  // them, and takes the previous rank's; the blocks merge into an fp32 output by their
  // log-sum-exp, which the backward keeps (act.attention_saved).
  const AttentionDims dims = attention_dims();
  float* lse = act.attention_saved;
  backend_.pack_key_values(act.qkv, dims, scratch_.ring_kv);
  backend_.fill(scratch_.ring_out, width_.tokens * width_.query, 0.0f);
  backend_.fill(lse, width_.batch * width_.heads * width_.seq, -INFINITY);
  Activation current = scratch_.ring_kv, next = scratch_.ring_kv_next;
  const int64_t cp = context_parallel_->size();
  for (int64_t step = 0; step < cp; ++step) {
    Request exchange;
    if (step + 1 < cp) exchange = pass_on(current, next);
    for_each_ring_block(step, [&](const AttentionChunkBlock& block) {
      backend_.attention_block_forward(act.qkv, current, dims, block, dropout, scratch_.ring_out, lse);
    });
    if (exchange) exchange->wait();
    std::swap(current, next);
  }
  backend_.convert(scratch_.ring_out, width_.tokens * width_.query, act.attention);
}

void StageChunk::attention_backward(std::size_t l, const LayerActivations& act,
                                    const std::optional<int64_t>& first_sample) {
  const DropoutMask dropout = dropout_mask(DropoutKind::kAttentionProbabilities, l, first_sample);
  if (!context_parallel_) {
    backend_.attention_backward(scratch_.d_hidden, act.qkv, act.attention, act.attention_saved, width_.batch,
                                width_.seq, width_.heads, width_.groups, width_.head_dim, dropout, scratch_.d_qkv);
    return;
  }
  // The ring again: the keys and values travel as in the forward. Each step's gradients of those
  // in hand go into a buffer of their own while the sum their earlier holders made arrives; the
  // two are added and sent on, so that every exchange overlaps the next step's blocks. After the
  // last step the sums go one rank further, home.
  const AttentionDims dims = attention_dims();
  backend_.pack_key_values(act.qkv, dims, scratch_.ring_kv);
  backend_.zero(scratch_.d_qkv, width_.tokens * width_.qkv);
  Activation kv = scratch_.ring_kv, kv_next = scratch_.ring_kv_next, arriving = scratch_.ring_dkv_in;
  const std::array<Activation, 2> sums = {scratch_.ring_dkv, scratch_.ring_dkv_next};
  const int64_t cp = context_parallel_->size();
  Request sums_exchange;
  for (int64_t step = 0; step < cp; ++step) {
    Request kv_exchange;
    if (step + 1 < cp) kv_exchange = pass_on(kv, kv_next);
    const Activation sum = sums[static_cast<std::size_t>(step % 2)];
    backend_.zero(sum, key_value_elements());
    for_each_ring_block(step, [&](const AttentionChunkBlock& block) {
      backend_.attention_block_backward(scratch_.d_hidden, act.qkv, act.attention, act.attention_saved, kv, dims, block,
                                        dropout, scratch_.d_qkv, sum);
    });
    // The earlier holders' sum has arrived, and the other buffer, which the next step fills, has gone.
    if (sums_exchange) {
      sums_exchange->wait();
      backend_.add(sum, arriving, key_value_elements(), sum);
    }
    sums_exchange = pass_on(sum, arriving);
    if (kv_exchange) kv_exchange->wait();
    std::swap(kv, kv_next);
  }
  sums_exchange->wait();
  backend_.unpack_key_value_gradients(arriving, dims, scratch_.d_qkv);
}

template <typename Run>
void StageChunk::for_each_ring_block(int64_t step, const Run& run) const {
  const int64_t cp = context_parallel_->size(), rank = context_parallel_->rank();
  const RingStep ring = ring_step(rank, step, cp);
  const std::array<int64_t, 2> theirs = context_chunks(ring.source, cp);
  const std::array<int64_t, 2> mine = {places_.first, places_.second};
  for (int i = 0; i < ring.count; ++i) {
    const AttentionBlock& b = ring.blocks[static_cast<std::size_t>(i)];
    const auto q = static_cast<std::size_t>(b.query_chunk), k = static_cast<std::size_t>(b.key_chunk);
    run(AttentionChunkBlock{q, k, mine[q] * places_.chunk, theirs[k] * places_.chunk});
  }
}

void StageChunk::layer_forward(std::size_t l, const LayerActivations& act, const std::optional<int64_t>& first_sample,
                               ConstActivation& stream, PendingBranch& pending, MoeMlpSaved* moe, bool again) {
  const std::size_t count = width_.tokens, h = width_.hidden, q = width_.query, qkv = width_.qkv, fc1 = width_.fc1,
                    f = width_.ffn;
  const Layer& weights = layers_[l];
  const auto bias = [](const Parameter* p) { return p ? p->compute : nullptr; };
  const auto epilogue = [](const Parameter* p) { return p ? GemmEpilogue::kBias : GemmEpilogue::kNone; };
  // A row-parallel layer's bias is added once to the sum: by tensor-parallel rank 0, before it.
  const Parameter* proj_bias = tp_rank_ == 0 ? weights.proj_bias : nullptr;
  const Parameter* fc2_bias = tp_rank_ == 0 ? weights.fc2_bias : nullptr;
  if (pending.output) {
    norm_forward(stream, pending, act.input, weights.ln1_gamma, weights.ln1_beta, scratch_.norm_out, act.ln1_mean,
                 act.ln1_rstd);
  } else {
    norm_forward(act.input, {}, nullptr, weights.ln1_gamma, weights.ln1_beta, scratch_.norm_out, act.ln1_mean,
                 act.ln1_rstd);
  }
  // With the query and key norms the projection's output is kept as their input (their backward's).
  backend_.linear_forward(gather_rows(scratch_.norm_out, scratch_.gathered), weights.qkv_weight->compute,
                          bias(weights.qkv_bias), count, h, qkv, epilogue(weights.qkv_bias),
                          recipe_.qk_norm ? act.qk_input : act.qkv, nullptr);
  if (recipe_.qk_norm) {
    backend_.head_rmsnorm_forward(act.qk_input, weights.q_norm->compute, weights.k_norm->compute, count, width_.groups,
                                  width_.group_heads, width_.head_dim, norm_epsilon_, act.qkv, act.qk_rstd);
  }
  rotate(act.qkv, false);
  attention_forward(l, act, first_sample);
  backend_.linear_forward(act.attention, weights.proj_weight->compute, bias(proj_bias), count, q, h,
                          epilogue(proj_bias), partial_of(scratch_.branch_out), nullptr);
  if (Request done = reduce(scratch_.branch_out)) done->wait();
  // Each branch's whole output (after the tensor-parallel sum) goes through its dropout inside the
  // norm (or the stage output's add) that adds it to the stream: Megatron's bias-dropout-add, fused.
  norm_forward(act.input, {scratch_.branch_out, dropout_mask(DropoutKind::kAttentionBranch, l, first_sample)},
               act.middle, weights.ln2_gamma, weights.ln2_beta, scratch_.norm_out, act.ln2_mean, act.ln2_rstd);
  if (moe) {
    // The router reads the rank's rows; a shared expert, the tp group's. Only a training forward
    // adds the router losses (evaluation has no sample; recomputation added them already).
    ExpertBiases& biases = expert_biases_;
    const float* expert_bias = biases.biases ? biases.biases + weights.expert_bias * biases.experts : nullptr;
    const bool training = first_sample.has_value() && !again;
    moe_->forward(scratch_.norm_out, moe_shared_input(), moe_weights(weights), expert_bias, *moe, scratch_.branch_out,
                  training, first_layer_ + static_cast<int64_t>(l));
    // A training forward's dispatch counts toward the next update (Megatron counts the routes of
    // forwards under autograd, after the capacity's drops).
    if (expert_bias && training) {
      int64_t* routed = biases.routed.data() + weights.expert_bias * biases.experts;
      for (std::size_t e = 0; e < biases.experts; ++e) routed[e] += moe->rows_per_expert[e];
    }
  } else {
    ConstActivation ln2 = gather_rows(scratch_.norm_out, scratch_.gathered);
    if (recipe_.swiglu) {
      backend_.linear_forward(ln2, weights.fc1_weight->compute, bias(weights.fc1_bias), count, h, fc1,
                              epilogue(weights.fc1_bias), act.fc1, nullptr);
      backend_.swiglu_forward(act.fc1, count, f, scratch_.swiglu_out);
    } else {
      backend_.linear_forward(ln2, weights.fc1_weight->compute, weights.fc1_bias->compute, count, h, f,
                              GemmEpilogue::kBiasGelu, act.activated, act.fc1);
    }
    backend_.linear_forward(recipe_.swiglu ? scratch_.swiglu_out : act.activated, weights.fc2_weight->compute,
                            bias(fc2_bias), count, f, h, epilogue(fc2_bias), partial_of(scratch_.branch_out), nullptr);
    if (Request done = reduce(scratch_.branch_out)) done->wait();
  }
  stream = act.middle;
  pending = {scratch_.branch_out, dropout_mask(DropoutKind::kMlpBranch, l, first_sample)};
}

void StageChunk::dense_mlp_backward(std::size_t l, const LayerActivations& act, ConstActivation d_out_full,
                                    DeferredGradients* deferred) {
  const std::size_t count = width_.tokens, h = width_.hidden, fc1 = width_.fc1, f = width_.ffn;
  const Layer& weights = layers_[l];
  // out = middle + fc2(act(fc1(ln2(middle)))); with GELU, fc2's input gradient goes through the
  // GELU in the same GEMM; SwiGLU's gradient is a pass of its own, and its output (fc2's input) is
  // not kept but computed again from fc1's for fc2's weight gradient (a pass over tokens x ffn
  // against a tokens x ffn buffer per layer), into scratch_.d_activated, which the backward is then done with.
  ConstActivation fc2_input = act.activated;
  if (recipe_.swiglu) {
    backend_.linear_backward(d_out_full, nullptr, weights.fc2_weight->compute, count, f, h, scratch_.d_activated,
                             nullptr, nullptr);
    backend_.swiglu_backward(scratch_.d_activated, act.fc1, count, f, scratch_.d_ffn);
    if (!deferred) backend_.swiglu_forward(act.fc1, count, f, scratch_.d_activated);
    fc2_input = scratch_.d_activated;
  } else {
    backend_.linear_backward_through_gelu(d_out_full, weights.fc2_weight->compute, count, f, h, act.fc1,
                                          scratch_.d_ffn);
  }
  weight_gradient_or_keep(d_out_full, fc2_input, f, h, weights.fc2_weight, weights.fc2_bias,
                          kept_for_w(deferred, &DeferredGradients::fc2));
  norm_forward(act.middle, {}, nullptr, weights.ln2_gamma, weights.ln2_beta, scratch_.norm_out, act.ln2_mean,
               act.ln2_rstd);  // recomputed, not kept
  ConstActivation ln2_full = gather_rows(scratch_.norm_out, scratch_.gathered);
  // A column-parallel layer's input gradient is a partial sum: its reduction overlaps the weight gradient.
  backend_.linear_backward(scratch_.d_ffn, ln2_full, weights.fc1_weight->compute, count, h, fc1,
                           partial_of(scratch_.d_hidden), nullptr, nullptr);
  Request summed = reduce(scratch_.d_hidden);
  weight_gradient_or_keep(scratch_.d_ffn, ln2_full, h, fc1, weights.fc1_weight, weights.fc1_bias,
                          kept_for_w(deferred, &DeferredGradients::fc1));
  if (summed) summed->wait();
}

void StageChunk::layer_backward(std::size_t l, const LayerActivations& act, const std::optional<int64_t>& first_sample,
                                Activation d_out, Activation d_middle, DeferredGradients* deferred,
                                const MoeMlpSaved* moe, MoeMlpDeferred* moe_deferred, float loss_scale) {
  const std::size_t count = width_.tokens, h = width_.hidden, q = width_.query, qkv = width_.qkv;
  const Layer& weights = layers_[l];
  // The MLP branch's gradient is the output's through the branch's dropout (the residual path's is not).
  const DropoutMask mlp_mask = dropout_mask(DropoutKind::kMlpBranch, l, first_sample);
  if (moe) {  // on the rank's rows, as its forward
    ConstActivation d_out_rows = masked_rows(d_out, mlp_mask);
    norm_forward(act.middle, {}, nullptr, weights.ln2_gamma, weights.ln2_beta, scratch_.norm_out, act.ln2_mean,
                 act.ln2_rstd);  // recomputed, not kept
    moe_->backward(d_out_rows, scratch_.norm_out, moe_shared_input(), moe_weights(weights), *moe,
                   moe_gradients(weights), loss_scale, scratch_.d_hidden, moe_deferred);
  } else {
    dense_mlp_backward(l, act, masked_gradient(d_out, mlp_mask), deferred);
  }
  norm_backward(scratch_.d_hidden, act.middle, weights.ln2_gamma, weights.ln2_beta, act.ln2_mean, act.ln2_rstd, d_out,
                d_middle);
  // middle = input + proj(attention(rope(qkv(ln1(input))))).
  ConstActivation d_middle_full =
      masked_gradient(d_middle, dropout_mask(DropoutKind::kAttentionBranch, l, first_sample));
  backend_.linear_backward(d_middle_full, act.attention, weights.proj_weight->compute, count, q, h, scratch_.d_hidden,
                           nullptr, nullptr);
  weight_gradient_or_keep(d_middle_full, act.attention, q, h, weights.proj_weight, weights.proj_bias,
                          kept_for_w(deferred, &DeferredGradients::proj));
  attention_backward(l, act, first_sample);
  rotate(scratch_.d_qkv, true);  // the gradient before the rotation
  if (recipe_.qk_norm) {         // and before the query and key norms: the projection's output's
    backend_.head_rmsnorm_backward(scratch_.d_qkv, act.qk_input, weights.q_norm->compute, weights.k_norm->compute,
                                   act.qk_rstd, count, width_.groups, width_.group_heads, width_.head_dim,
                                   scratch_.d_qkv, weights.q_norm->gradient, weights.k_norm->gradient);
  }
  norm_forward(act.input, {}, nullptr, weights.ln1_gamma, weights.ln1_beta, scratch_.norm_out, act.ln1_mean,
               act.ln1_rstd);  // recomputed, not kept
  ConstActivation ln1_full = gather_rows(scratch_.norm_out, scratch_.gathered);
  backend_.linear_backward(scratch_.d_qkv, ln1_full, weights.qkv_weight->compute, count, h, qkv,
                           partial_of(scratch_.d_hidden), nullptr, nullptr);
  const Request summed = reduce(scratch_.d_hidden);
  weight_gradient_or_keep(scratch_.d_qkv, ln1_full, h, qkv, weights.qkv_weight, weights.qkv_bias,
                          kept_for_w(deferred, &DeferredGradients::qkv));
  if (summed) summed->wait();
  // The input's gradient goes to d_out's buffer: it is the previous layer's output gradient.
  norm_backward(scratch_.d_hidden, act.input, weights.ln1_gamma, weights.ln1_beta, act.ln1_mean, act.ln1_rstd, d_middle,
                d_out);
}

void StageChunk::backward_input(int64_t microbatch, ConstActivation output_gradient, float loss_scale,
                                Activation input_gradient, bool defer) {
  Activations a = take(in_flight_, microbatch, "a backward without its forward");
  const std::size_t seq = width_.seq, count = width_.tokens, rows = width_.rows, h = width_.hidden,
                    v = width_.vocabulary, vocab_start = width_.vocabulary_start;

  // scratch_.d_out holds the stream's gradient at a layer's output, scratch_.d_middle at its middle.
  Activation d_out = scratch_.d_out, d_middle = scratch_.d_middle;
  if (has_output_) {
    // The loss's gradient overwrites the logits (and waits there for W under I).
    backend_.cross_entropy_backward(a.head.logits, a.head.loss_saved, a.labels.data(), a.weights.data(), count, v,
                                    vocab_start, loss_scale, a.head.logits);
    backend_.linear_backward(a.head.logits, a.head.final_norm, output_weight_->compute, count, h, v,
                             partial_of(scratch_.d_hidden), nullptr, nullptr);
    Request summed = reduce(scratch_.d_hidden);
    if (!defer) {
      backend_.linear_backward(a.head.logits, a.head.final_norm, output_weight_->compute, count, h, v, nullptr,
                               output_weight_->gradient, nullptr);
    }
    if (summed) summed->wait();
    norm_backward(scratch_.d_hidden, a.head.output, final_gamma_, final_beta_, a.head.final_mean, a.head.final_rstd,
                  nullptr, d_out);
    if (!defer) gradients_done_from(final_gamma_);
  } else {
    backend_.copy(output_gradient, rows * h, d_out);
  }
  if (defer) {
    a.deferred.resize(layers_.size());
    for (std::size_t l = 0; l < layers_.size(); ++l) allocate(recipe_.deferred(layers_[l].moe), a.deferred[l]);
    a.moe_deferred.resize(layers_.size());
    a.moe_lent.assign(layers_.size(), SIZE_MAX);
  }
  a.work = a.layers;
  for (std::size_t g = groups_.size(); g-- > 0;) {
    const LayerGroup& group = groups_[g];
    const auto first = static_cast<std::size_t>(group.first_layer);
    const auto end = first + static_cast<std::size_t>(group.num_layers);
    // A set a layer: a recomputed group's, each layer's (its MoE MLP runs on it), or selective
    // recomputation's for the attention core.
    std::vector<LentSet> borrowed(end - first);
    if (group.recomputed) {
      // Full recomputation: the group's forward again, from its kept input, on borrowed buffers.
      ConstActivation stream = a.work[first].input;
      PendingBranch pending;
      for (std::size_t l = first; l < end; ++l) {
        LentSet& set = borrowed[l - first] = borrow();
        fill_missing(a.work[l], set.layer);
        layer_forward(l, a.work[l], a.first_sample, stream, pending, moe_buffers(l, a, set), true);
      }
    }
    for (std::size_t l = end; l-- > first;) {
      LentSet& set = borrowed[l - first];
      if (keep_[l] == Keep::kAllButAttention) {
        // Selective recomputation: the attention core again, from the kept qkv.
        set = borrow();
        fill_missing(a.work[l], set.layer);
        attention_forward(l, a.work[l], a.first_sample);
      }
      const MoeMlpSaved* moe = moe_buffers(l, a, set);
      MoeMlpDeferred* moe_kept = nullptr;
      if (defer && moe) {
        a.moe_deferred[l] = moe_->allocate_deferred(*moe);
        moe_kept = &a.moe_deferred[l];
      }
      layer_backward(l, a.work[l], a.first_sample, d_out, d_middle, defer ? &a.deferred[l] : nullptr, moe, moe_kept,
                     loss_scale);
      if (!defer) gradients_done_from(layers_[l].ln1_gamma);
    }
    // W still reads what was recomputed; B is done with it.
    for (std::size_t l = first; l < end; ++l) {
      LentSet& set = borrowed[l - first];
      if (!set.layer.qkv) continue;  // a layer that kept everything borrowed none
      if (defer) {
        if (moe_buffers(l, a, set) == &set.moe) a.moe_lent[l] = a.borrowed.size();
        a.borrowed.push_back(std::move(set));
      } else {
        give_back(set);
      }
    }
  }
  if (!has_embedding_) {
    backend_.copy(d_out, rows * h, input_gradient);
  } else if (defer) {
    // The embedding's gradient is a weight gradient.
    a.input_gradient =
        backend_.allocate_activation(static_cast<std::size_t>(recipe_.deferred_embedding_gradient().count));
    backend_.copy(masked_gradient(d_out, dropout_mask(DropoutKind::kEmbedding, 0, a.first_sample)), count * h,
                  a.input_gradient);
  } else {
    backend_.embedding_backward(masked_gradient(d_out, dropout_mask(DropoutKind::kEmbedding, 0, a.first_sample)),
                                a.inputs.data(), count, seq, h, vocab_start, v, word_embeddings_->gradient,
                                position_embeddings_ ? position_embeddings_->gradient : nullptr, places_);
    gradients_done_from(word_embeddings_);
  }
  if (defer) {
    awaiting_weight_.emplace(microbatch, std::move(a));
  } else {
    spare_.push_back(std::move(a));
  }
}

void StageChunk::backward_weight(int64_t microbatch) {
  Activations a = take(awaiting_weight_, microbatch, "W without its I");
  weight_gradients(a);
  for (DeferredGradients& kept : a.deferred) release(kept);
  a.deferred.clear();
  for (MoeMlpDeferred& kept : a.moe_deferred) {
    if (moe_) moe_->release(kept);
  }
  a.moe_deferred.clear();
  for (LentSet& set : a.borrowed) give_back(set);
  a.borrowed.clear();
  if (a.input_gradient) backend_.release(a.input_gradient);
  a.input_gradient = nullptr;
  spare_.push_back(std::move(a));
}

void StageChunk::weight_gradient_or_keep(ConstActivation dy, ConstActivation x, std::size_t k, std::size_t n,
                                         Parameter* weight, Parameter* bias, Activation* keep) {
  if (keep) {
    backend_.copy(dy, width_.tokens * n, *keep);
  } else {
    accumulate_weight_gradient(dy, x, k, n, weight, bias);
  }
}

void StageChunk::accumulate_weight_gradient(ConstActivation dy, ConstActivation x, std::size_t k, std::size_t n,
                                            Parameter* weight, Parameter* bias) {
  backend_.linear_backward(dy, x, weight->compute, width_.tokens, k, n, nullptr, weight->gradient,
                           bias ? bias->gradient : nullptr);
}

void StageChunk::layer_weight_gradients(std::size_t l, const LayerActivations& act, const DeferredGradients& kept,
                                        const MoeMlpSaved* moe, const MoeMlpDeferred* moe_kept) {
  const std::size_t count = width_.tokens, h = width_.hidden, q = width_.query, qkv = width_.qkv, fc1 = width_.fc1,
                    f = width_.ffn;
  const Layer& weights = layers_[l];
  if (moe) {  // the router and the experts read the second norm's output
    norm_forward(act.middle, {}, nullptr, weights.ln2_gamma, weights.ln2_beta, scratch_.norm_out, act.ln2_mean,
                 act.ln2_rstd);
    moe_->weight_gradients(scratch_.norm_out, moe_shared_input(), *moe, *moe_kept, moe_gradients(weights));
  } else {
    if (recipe_.swiglu) backend_.swiglu_forward(act.fc1, count, f, scratch_.d_activated);  // fc2's input again
    accumulate_weight_gradient(kept.fc2, recipe_.swiglu ? scratch_.d_activated : act.activated, f, h,
                               weights.fc2_weight, weights.fc2_bias);
    norm_forward(act.middle, {}, nullptr, weights.ln2_gamma, weights.ln2_beta, scratch_.norm_out, act.ln2_mean,
                 act.ln2_rstd);
    accumulate_weight_gradient(kept.fc1, gather_rows(scratch_.norm_out, scratch_.gathered), h, fc1, weights.fc1_weight,
                               weights.fc1_bias);
  }
  accumulate_weight_gradient(kept.proj, act.attention, q, h, weights.proj_weight, weights.proj_bias);
  norm_forward(act.input, {}, nullptr, weights.ln1_gamma, weights.ln1_beta, scratch_.norm_out, act.ln1_mean,
               act.ln1_rstd);
  accumulate_weight_gradient(kept.qkv, gather_rows(scratch_.norm_out, scratch_.gathered), h, qkv, weights.qkv_weight,
                             weights.qkv_bias);
}

void StageChunk::weight_gradients(Activations& a) {
  // I took the norms' gradients: each part is done with its linear layers'.
  if (has_output_) {
    accumulate_weight_gradient(a.head.logits, a.head.final_norm, width_.hidden, width_.vocabulary, output_weight_,
                               nullptr);
    gradients_done_from(final_gamma_);
  }
  for (std::size_t l = layers_.size(); l-- > 0;) {
    const MoeMlpSaved* moe = nullptr;
    if (layers_[l].moe) moe = a.moe_lent[l] == SIZE_MAX ? &a.moe[l] : &a.borrowed[a.moe_lent[l]].moe;
    layer_weight_gradients(l, a.work[l], a.deferred[l], moe, moe ? &a.moe_deferred[l] : nullptr);
    gradients_done_from(layers_[l].ln1_gamma);
  }
  if (has_embedding_) {
    backend_.embedding_backward(a.input_gradient, a.inputs.data(), width_.tokens, width_.seq, width_.hidden,
                                width_.vocabulary_start, width_.vocabulary, word_embeddings_->gradient,
                                position_embeddings_ ? position_embeddings_->gradient : nullptr, places_);
    gradients_done_from(word_embeddings_);
  }
}

}  // namespace megaplan::exec
