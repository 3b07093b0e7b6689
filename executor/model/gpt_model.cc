#include "executor/model/gpt_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <stdexcept>

#include "core/error.h"
#include "core/executor_support.h"
#include "core/fnv1a.h"
#include "core/formulas.h"
#include "core/pipeline_layout.h"
#include "executor/model/vocabulary_parallel_loss.h"

namespace megaplan::exec {

namespace {

// The running loss sum's floats in the loss memory: one double.
constexpr std::size_t kLossSumFloats = sizeof(double) / sizeof(float);

std::size_t product(const std::vector<int64_t>& shape) {
  std::size_t size = 1;
  for (int64_t extent : shape) size *= static_cast<std::size_t>(extent);
  return size;
}

// A parameter's seed: FNV-1a of its name (not std::hash, which differs between standard
// libraries), from a tenth of FNV's offset basis. The basis is a slip kept on purpose: every run's
// initial weights, and so every recorded loss, derive from it.
uint64_t name_hash(const std::string& name) { return Fnv1a64(1469598103934665603ull).add(name).value(); }

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void GptModel::refuse_unsupported(const ModelSpec& model, const ParallelPlan& plan) {
  if (std::optional<SpecError> refusal = executor_model_refusal(model)) throw *refusal;
  if (std::optional<SpecError> refusal = executor_plan_refusal(plan)) throw *refusal;
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

void GptModel::add_parameter(const ParameterSpec& spec) {
  Parameter parameter;
  static_cast<ParameterSpec&>(parameter) = spec;
  const std::size_t index = parameters_.size();
  parameter.value = values_ + layout_.offsets[index];
  parameter.gradient = gradients_ + layout_.offsets[index];
  parameter.compute = backend_.compute_copy(parameter.value, parameter.size);
  parameters_.push_back(std::move(parameter));
}

GptModel::GptModel(const ModelSpec& model, const ParallelPlan& plan, int64_t stage, Backend& backend,
                   const Initialisation& init, Parameter* tied_embedding, Comm* tensor_parallel,
                   std::size_t bucket_size)
    : backend_(backend),
      stage_(stage),
      hidden_(model.hidden_size),
      heads_(model.num_attention_heads),
      query_groups_(model.effective_num_query_groups()),
      dim_(model.effective_kv_channels()),
      layers_total_(model.num_layers),
      ffn_(model.effective_ffn_hidden_size()),
      seq_(model.seq_length),
      vocab_(padded_vocab_size(model, plan.tensor_parallel_size)),
      batch_(plan.micro_batch_size),
      rms_norm_(model.normalization == Normalization::kRMSNorm),
      swiglu_(model.swiglu),
      rope_(model.position_embedding_type == PositionEmbedding::kRope),
      untied_(model.untie_embeddings_and_output_weights),
      rotary_dim_(model.rotary_dim()),
      rotary_(model.rotary_base, model.rope_scaling),
      norm_epsilon_(static_cast<float>(model.norm_epsilon)),
      hidden_dropout_(plan.options.hidden_dropout),
      attention_dropout_(plan.options.attention_dropout),
      seed_(init.seed),
      tensor_parallel_(tensor_parallel),
      tp_(plan.tensor_parallel_size),
      tp_rank_(tensor_parallel ? tensor_parallel->rank() : 0),
      sequence_parallel_(plan.sequence_parallel),
      heads_local_(heads_ / tp_),
      groups_local_(query_groups_ / tp_),
      q_local_(heads_local_ * dim_),
      qkv_local_(groups_local_ * (heads_ / query_groups_ + 2) * dim_),
      fc1_local_(swiglu_ ? 2 * ffn_ / tp_ : ffn_ / tp_),
      ffn_local_(ffn_ / tp_),
      vocab_local_(vocab_ / tp_),
      vocab_start_(tp_rank_ * vocab_local_),
      rows_(plan.sequence_parallel ? batch_ * seq_ / tp_ : batch_ * seq_),
      activation_type_(backend.activation_type()) {
  refuse_unsupported(model, plan);
  if ((tp_ > 1) != (tensor_parallel != nullptr) || (tensor_parallel && tensor_parallel->size() != tp_)) {
    throw std::logic_error("GptModel: the tensor-parallel group does not match the plan's tp");
  }
  if (plan.micro_batch_size <= 0) throw SpecError("--micro-batch-size", "must be a positive integer");
  const StageLayers stage_layout = stage_layers(stage, model, plan);
  first_layer_ = stage_layout.first_layer;
  has_embedding_ = stage_layout.has_embedding;
  has_output_ = stage_layout.has_output_layer;
  groups_ = recompute_groups(plan, stage_layout.num_layers);
  keep_ = layer_keeps(plan, groups_);

  const std::vector<ParameterSpec> specs = describe_parameters(model, plan, stage, tp_rank_);
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
    layers_.push_back(
        {find(prefix + "input_layernorm.weight"), find(prefix + "input_layernorm.bias"),
         find(prefix + "self_attention.linear_qkv.weight"), find(prefix + "self_attention.linear_qkv.bias"),
         find(prefix + "self_attention.linear_proj.weight"), find(prefix + "self_attention.linear_proj.bias"),
         find(prefix + "pre_mlp_layernorm.weight"), find(prefix + "pre_mlp_layernorm.bias"),
         find(prefix + "mlp.linear_fc1.weight"), find(prefix + "mlp.linear_fc1.bias"),
         find(prefix + "mlp.linear_fc2.weight"), find(prefix + "mlp.linear_fc2.bias")});
  }
  if (has_output_) {
    final_gamma_ = find("decoder.final_layernorm.weight");
    final_beta_ = find("decoder.final_layernorm.bias");
    Parameter* own = find(kOutputWeight);
    if (!untied_) output_copy_ = own;
    output_weight_ = own ? own : word_embeddings_ ? word_embeddings_ : tied_embedding;
    if (!output_weight_) throw std::logic_error("GptModel: the last stage needs stage 0's word embedding on its rank");
  }
  initialise(init);

  const auto tokens = static_cast<std::size_t>(batch_ * seq_);
  const auto rows = static_cast<std::size_t>(rows_);
  const auto hs = static_cast<std::size_t>(hidden_);
  norm_out_ = backend_.allocate_activation(rows * hs);
  branch_out_ = backend_.allocate_activation(rows * hs);
  d_hidden_ = backend_.allocate_activation(tokens * std::max(hs, static_cast<std::size_t>(q_local_)));
  d_residual_[0] = backend_.allocate_activation(rows * hs);
  d_residual_[1] = backend_.allocate_activation(rows * hs);
  d_qkv_ = backend_.allocate_activation(tokens * static_cast<std::size_t>(qkv_local_));
  d_ffn_ = backend_.allocate_activation(tokens * static_cast<std::size_t>(fc1_local_));
  if (swiglu_) {
    swiglu_out_ = backend_.allocate_activation(tokens * static_cast<std::size_t>(ffn_local_));
    d_activated_ = backend_.allocate_activation(tokens * static_cast<std::size_t>(ffn_local_));
  }
  if (sequence_parallel_) {
    gathered_ = backend_.allocate_activation(tokens * hs);
    partial_ = backend_.allocate_activation(tokens * hs);
  }
  if (has_output_) {
    loss_memory_ = backend_.allocate(kLossSumFloats + 3 * tokens);
    loss_sum_ = reinterpret_cast<double*>(loss_memory_);  // allocations are at least 16-byte aligned
    statistics_ = loss_memory_ + kLossSumFloats;
  }
}

void GptModel::initialise(const Initialisation& init) {
  // Megatron's initialisation: normal(0, --init-method-std), output projections scaled by
  // 1 / sqrt(2 L). The output layer's copy draws the word embedding's values: the two start equal,
  // as Megatron makes them by broadcasting the first stage's.
  const uint64_t seed = init.seed;
  const double sigma = init.init_method_std;
  const double output_sigma = sigma / std::sqrt(2.0 * static_cast<double>(layers_total_));
  for (Parameter& parameter : parameters_) {
    std::vector<float> host(product(parameter.global_shape), 0.0f);
    // The tied copy draws the word embedding's values; an untied output layer its own.
    const std::string& source = &parameter == output_copy_ ? std::string(kWordEmbeddings) : parameter.name;
    if (ends_with(parameter.name, "layernorm.weight")) {
      std::fill(host.begin(), host.end(), 1.0f);
    } else if (!ends_with(parameter.name, "bias")) {
      const bool output =
          ends_with(parameter.name, "linear_proj.weight") || ends_with(parameter.name, "linear_fc2.weight");
      const uint64_t hash = name_hash(source);
      std::seed_seq sequence{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                             static_cast<uint32_t>(hash), static_cast<uint32_t>(hash >> 32)};
      std::mt19937_64 generator(sequence);
      std::normal_distribution<double> normal(0.0, output ? output_sigma : sigma);
      for (float& value : host) value = static_cast<float>(normal(generator));
    }
    // The rank's part of the whole tensor the single-rank run draws.
    if (parameter.shard_count > 1) host = reshard({host}, TensorCut{}, parameter.global_shape, tensor_cut(parameter));
    backend_.upload(parameter.value, host.data(), parameter.size);
  }
  refresh_compute_weights();
  zero_gradients();
}

GptModel::~GptModel() {
  for (auto* held : {&in_flight_, &awaiting_weight_}) {
    for (auto& [microbatch, activations] : *held) release_activations(activations);
  }
  for (Activations& activations : spare_) release_activations(activations);
  for (LayerActivations& layer : pool_) release_layer(layer);
  for (Parameter& parameter : parameters_) backend_.release_compute_copy(parameter.compute, parameter.value);
  backend_.release(values_);
  backend_.release(gradients_);
  for (Activation buffer : {norm_out_, branch_out_, d_hidden_, d_residual_[0], d_residual_[1], d_qkv_, d_ffn_,
                            swiglu_out_, d_activated_, gathered_, partial_}) {
    if (buffer) backend_.release(buffer);
  }
  if (loss_memory_) backend_.release(loss_memory_);
}

void GptModel::refresh_compute_weights() {
  for (Parameter& p : parameters_) backend_.refresh_compute_copy(p.value, p.size, p.compute);
}

void GptModel::zero_gradients() { backend_.fill(gradients_, layout_.total, 0.0f); }

GptModel::LayerActivations GptModel::allocate_layer(Keep keep) {
  const auto tokens = static_cast<std::size_t>(batch_ * seq_);
  const auto rows = static_cast<std::size_t>(rows_);
  const auto h = static_cast<std::size_t>(hidden_);
  const auto stats = [&] { return backend_.allocate(rows); };
  const auto act = [&](std::size_t n) { return backend_.allocate_activation(n); };
  LayerActivations layer;
  if (keep == Keep::kNothing) return layer;
  layer.input = act(rows * h);
  if (keep == Keep::kInput) return layer;
  layer.qkv = act(tokens * static_cast<std::size_t>(qkv_local_));
  layer.middle = act(rows * h);
  layer.fc1 = act(tokens * static_cast<std::size_t>(fc1_local_));
  if (!swiglu_) layer.activated = act(tokens * static_cast<std::size_t>(ffn_local_));
  if (!rms_norm_) layer.ln1_mean = stats();
  layer.ln1_rstd = stats();
  if (!rms_norm_) layer.ln2_mean = stats();
  layer.ln2_rstd = stats();
  if (keep == Keep::kAll) {
    layer.attention = act(tokens * static_cast<std::size_t>(q_local_));
    layer.attention_saved = backend_.allocate(
        backend_.attention_saved_size(static_cast<std::size_t>(batch_), static_cast<std::size_t>(seq_),
                                      static_cast<std::size_t>(heads_local_), static_cast<std::size_t>(dim_)));
  }
  return layer;
}

void GptModel::release_layer(LayerActivations& l) {
  for (Activation buffer : {l.input, l.qkv, l.attention, l.middle, l.fc1, l.activated}) {
    if (buffer) backend_.release(buffer);
  }
  for (float* buffer : {l.ln1_mean, l.ln1_rstd, l.attention_saved, l.ln2_mean, l.ln2_rstd}) {
    if (buffer) backend_.release(buffer);
  }
  l = LayerActivations{};
}

GptModel::LayerActivations GptModel::borrow() {
  if (pool_.empty()) return allocate_layer(Keep::kAll);
  LayerActivations layer = pool_.back();
  pool_.pop_back();
  return layer;
}

void GptModel::give_back(LayerActivations& layer) {
  pool_.push_back(layer);
  layer = LayerActivations{};
}

GptModel::Activations GptModel::allocate_activations() {
  if (!spare_.empty()) {
    Activations reused = std::move(spare_.back());
    spare_.pop_back();
    return reused;
  }
  const auto tokens = static_cast<std::size_t>(batch_ * seq_);
  const auto rows = static_cast<std::size_t>(rows_);
  const auto h = static_cast<std::size_t>(hidden_);
  Activations a;
  for (const Keep keep : keep_) a.layers.push_back(allocate_layer(keep));
  a.output = backend_.allocate_activation(rows * h);
  if (has_output_) {
    a.final_norm = backend_.allocate_activation(tokens * h);  // gathered: the output layer's input
    a.logits = backend_.allocate_activation(tokens * static_cast<std::size_t>(vocab_local_));
    if (!rms_norm_) a.final_mean = backend_.allocate(rows);
    a.final_rstd = backend_.allocate(rows);
    a.loss_saved = backend_.allocate(tokens);  // the whole vocabulary's log-sum-exp per row
  }
  return a;
}

void GptModel::release_activations(Activations& a) {
  for (LayerActivations& l : a.layers) release_layer(l);
  for (LayerActivations& l : a.borrowed) release_layer(l);
  for (const DeferredGradients& d : a.deferred) {
    for (Activation buffer : {d.qkv, d.proj, d.fc1, d.fc2}) {
      if (buffer) backend_.release(buffer);
    }
  }
  for (Activation buffer : {a.output, a.final_norm, a.logits, a.input_gradient}) {
    if (buffer) backend_.release(buffer);
  }
  for (float* buffer : {a.final_mean, a.final_rstd, a.loss_saved}) {
    if (buffer) backend_.release(buffer);
  }
  a.layers.clear();
  a.borrowed.clear();
  a.deferred.clear();
}

void GptModel::read_tokens(Activations& a, const MicrobatchTokens& data) const {
  const auto batch = static_cast<std::size_t>(batch_);
  const auto seq = static_cast<std::size_t>(seq_);
  const std::size_t count = batch * seq;
  if (data.tokens.size() != batch * (seq + 1) || data.loss_mask.size() != count) {
    throw SpecError("--micro-batch-size", "a microbatch needs " + std::to_string(batch * (seq + 1)) + " tokens, got " +
                                              std::to_string(data.tokens.size()));
  }
  a.inputs.resize(count);
  a.labels.resize(count);
  for (std::size_t b = 0; b < batch; ++b) {
    for (std::size_t s = 0; s < seq; ++s) {
      const int64_t input = data.tokens[b * (seq + 1) + s];
      const int64_t label = data.tokens[b * (seq + 1) + s + 1];
      if (input < 0 || input >= vocab_ || label < 0 || label >= vocab_) {
        throw SpecError("--data-path", "token " + std::to_string(std::max(input, label)) +
                                           " is outside the model's padded vocabulary of " + std::to_string(vocab_));
      }
      a.inputs[b * seq + s] = input;
      a.labels[b * seq + s] = label;
    }
  }
  a.mask = data.loss_mask;
}

void GptModel::run_forward(Activations& a, const MicrobatchTokens* data, std::optional<int64_t> first_sample) {
  if ((has_embedding_ || has_output_) && !data) throw std::logic_error("GptModel: the first and last stages read data");
  if (data) read_tokens(a, *data);
  a.first_sample = first_sample;
  const auto batch = static_cast<std::size_t>(batch_);
  const auto seq = static_cast<std::size_t>(seq_);
  const std::size_t count = batch * seq;
  const auto rows = static_cast<std::size_t>(rows_);
  const auto h = static_cast<std::size_t>(hidden_);
  const auto v = static_cast<std::size_t>(vocab_local_);
  // The residual stream: x_{l+1} = middle_l + mlp(ln2(middle_l)), middle_l = x_l + attention(ln1(x_l)).
  // Each branch's output waits in branch_out_ until the next norm adds it to the stream. A
  // non-first stage's input is already in the first layer's input (or, without layers, the output).
  Activation first_input = a.layers.empty() ? a.output : a.layers[0].input;
  if (has_embedding_) {
    // Vocabulary-parallel: each rank looks up its rows' tokens; the sum over the group is the embedding.
    backend_.embedding_forward(
        a.inputs.data(), count, seq, word_embeddings_->compute, static_cast<std::size_t>(vocab_start_), v,
        tp_rank_ == 0 && position_embeddings_ ? position_embeddings_->compute : nullptr, h, partial_of(first_input));
    if (Request done = reduce(first_input)) done->wait();
    const DropoutMask mask = dropout_mask(DropoutKind::kEmbedding, 0, first_sample);
    if (mask.active()) backend_.dropout(first_input, nullptr, rows, h, mask, first_input);
  }
  ConstActivation stream = first_input;
  PendingBranch pending;  // the branch output not yet added to `stream`
  // Layers that keep less than everything run on one borrowed set, which each layer's first norm
  // has read before the next layer writes it.
  LayerActivations scratch;
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    LayerActivations act = a.layers[l];
    if (keep_[l] != Keep::kAll) {
      if (!scratch.qkv) scratch = borrow();
      fill_missing(act, scratch);
    }
    layer_forward(l, act, first_sample, stream, pending);
  }
  if (!has_output_) {
    // The message to the next stage is the residual sum itself.
    if (pending.dropout.active()) {
      backend_.dropout(pending.output, stream, rows, h, pending.dropout, a.output);
    } else if (pending.output) {
      backend_.add(stream, pending.output, rows * h, a.output);
    }
    if (scratch.qkv) give_back(scratch);
    return;
  }
  Activation normed = sequence_parallel_ ? norm_out_ : a.final_norm;
  norm_forward(stream, pending, pending.output ? a.output : nullptr, final_gamma_, final_beta_, normed, a.final_mean,
               a.final_rstd);
  gather_rows(normed, a.final_norm);
  if (scratch.qkv) give_back(scratch);
  // The output layer (tied: the word embedding E): logits = final_norm E^T over the rank's vocabulary rows.
  backend_.linear_forward(a.final_norm, output_weight_->compute, nullptr, count, h, v, GemmEpilogue::kNone, a.logits,
                          nullptr);
  backend_.cross_entropy_statistics(a.logits, a.labels.data(), count, v, static_cast<std::size_t>(vocab_start_),
                                    statistics_, statistics_ + count,
                                    tensor_parallel_ ? statistics_ + 2 * count : nullptr);
  vocabulary_parallel_cross_entropy(backend_, tensor_parallel_, statistics_, a.mask.data(), count, a.loss_saved,
                                    loss_sum_);
}

double GptModel::take_loss_sum() {
  if (!has_output_) throw std::logic_error("GptModel: take_loss_sum on a stage without the loss");
  float words[kLossSumFloats];
  backend_.download(words, loss_memory_, kLossSumFloats);
  double sum = 0;
  std::memcpy(&sum, words, sizeof sum);
  const float zero[kLossSumFloats] = {};
  backend_.upload(loss_memory_, zero, kLossSumFloats);
  return sum;
}

ConstActivation GptModel::gather_rows(ConstActivation rows, Activation full) {
  if (!sequence_parallel_) return rows;
  tensor_parallel_->all_gather(rows, full, static_cast<std::size_t>(rows_ * hidden_), activation_type_)->wait();
  return full;
}

Activation GptModel::partial_of(Activation destination) { return sequence_parallel_ ? partial_ : destination; }

Request GptModel::reduce(Activation destination) {
  if (!tensor_parallel_) return nullptr;
  if (sequence_parallel_) {
    return tensor_parallel_->reduce_scatter(partial_, destination, static_cast<std::size_t>(rows_ * hidden_),
                                            activation_type_, ReduceOp::kSum);
  }
  return tensor_parallel_->all_reduce(destination, static_cast<std::size_t>(rows_ * hidden_), activation_type_,
                                      ReduceOp::kSum);
}

void GptModel::reduce_sequence_parallel_gradients(std::size_t first, std::size_t last) {
  if (!sequence_parallel_) return;
  std::vector<Parameter*> norms;
  for (const Layer& layer : layers_) {
    norms.insert(norms.end(), {layer.ln1_gamma, layer.ln1_beta, layer.ln2_gamma, layer.ln2_beta});
  }
  if (has_output_) norms.insert(norms.end(), {final_gamma_, final_beta_});
  std::vector<Request> pending;
  for (Parameter* norm : norms) {
    if (!norm) continue;  // RMSNorm has no bias
    const auto index = static_cast<std::size_t>(norm - parameters_.data());
    if (index < first || index > last) continue;
    pending.push_back(tensor_parallel_->all_reduce(norm->gradient, norm->size, DType::kFloat32, ReduceOp::kSum));
  }
  for (Request& request : pending) request->wait();
}

void GptModel::gradients_done_from(const Parameter* first) {
  if (gradient_progress_) gradient_progress_(static_cast<std::size_t>(first - parameters_.data()));
}

Activation GptModel::input_buffer(int64_t microbatch) {
  if (has_embedding_) throw std::logic_error("GptModel: the first stage reads tokens, not an input buffer");
  auto found = in_flight_.find(microbatch);
  if (found == in_flight_.end()) found = in_flight_.emplace(microbatch, allocate_activations()).first;
  Activations& a = found->second;
  return a.layers.empty() ? a.output : a.layers[0].input;
}

void GptModel::forward(int64_t microbatch, const MicrobatchTokens* data, int64_t first_sample) {
  auto found = in_flight_.find(microbatch);
  if (found == in_flight_.end()) {
    if (!has_embedding_) throw std::logic_error("GptModel: F of a non-first stage before its input arrived");
    found = in_flight_.emplace(microbatch, allocate_activations()).first;
  }
  run_forward(found->second, data, first_sample);
}

ConstActivation GptModel::output(int64_t microbatch) const {
  const auto found = in_flight_.find(microbatch);
  if (found == in_flight_.end() || has_output_) throw std::logic_error("GptModel::output without its forward");
  return found->second.output;
}

double GptModel::evaluate(const MicrobatchTokens* data, ConstActivation input, Activation output) {
  Activations a = allocate_activations();
  const std::size_t n = message_size();
  if (!has_embedding_) backend_.copy(input, n, a.layers.empty() ? a.output : a.layers[0].input);
  run_forward(a, data, std::nullopt);
  if (!has_output_) backend_.copy(a.output, n, output);
  spare_.push_back(std::move(a));
  return has_output_ ? take_loss_sum() : 0.0;
}

GptModel::Activations GptModel::take(std::map<int64_t, Activations>& from, int64_t microbatch, const char* why) {
  const auto found = from.find(microbatch);
  if (found == from.end()) throw std::logic_error(std::string("GptModel: ") + why);
  Activations a = std::move(found->second);
  from.erase(found);
  return a;
}

void GptModel::fill_missing(LayerActivations& act, const LayerActivations& from) {
  for (auto [field, source] : {std::pair{&act.input, from.input},
                               {&act.qkv, from.qkv},
                               {&act.attention, from.attention},
                               {&act.middle, from.middle},
                               {&act.fc1, from.fc1},
                               {&act.activated, from.activated}}) {
    if (!*field) *field = source;
  }
  for (auto [field, source] : {std::pair{&act.ln1_mean, from.ln1_mean},
                               {&act.ln1_rstd, from.ln1_rstd},
                               {&act.attention_saved, from.attention_saved},
                               {&act.ln2_mean, from.ln2_mean},
                               {&act.ln2_rstd, from.ln2_rstd}}) {
    if (!*field) *field = source;
  }
}

void GptModel::norm_forward(ConstActivation x, const PendingBranch& branch, Activation sum_out, const Parameter* gamma,
                            const Parameter* beta, Activation y, float* mean, float* rstd) {
  const auto rows = static_cast<std::size_t>(rows_);
  const auto h = static_cast<std::size_t>(hidden_);
  if (rms_norm_) {
    backend_.rmsnorm_forward(x, branch.output, branch.dropout, sum_out, gamma->compute, rows, h, norm_epsilon_, y,
                             rstd);
  } else {
    backend_.layernorm_forward(x, branch.output, branch.dropout, sum_out, gamma->compute, beta->compute, rows, h, y,
                               mean, rstd);
  }
}

void GptModel::norm_backward(ConstActivation dy, ConstActivation x, const Parameter* gamma, const Parameter* beta,
                             const float* mean, const float* rstd, ConstActivation residual_grad, Activation dx) {
  const auto rows = static_cast<std::size_t>(rows_);
  const auto h = static_cast<std::size_t>(hidden_);
  if (rms_norm_) {
    backend_.rmsnorm_backward(dy, x, gamma->compute, rstd, rows, h, residual_grad, dx, gamma->gradient);
  } else {
    backend_.layernorm_backward(dy, x, gamma->compute, mean, rstd, rows, h, residual_grad, dx, gamma->gradient,
                                beta->gradient);
  }
}

void GptModel::rotate(Activation qkv, bool inverse) {
  if (!rope_) return;
  backend_.rotary(qkv, static_cast<std::size_t>(batch_), static_cast<std::size_t>(seq_),
                  static_cast<std::size_t>(groups_local_), static_cast<std::size_t>(heads_ / query_groups_),
                  static_cast<std::size_t>(dim_), static_cast<std::size_t>(rotary_dim_), rotary_, inverse);
}

DropoutMask GptModel::dropout_mask(DropoutKind kind, std::size_t l, const std::optional<int64_t>& first_sample) const {
  DropoutMask mask;
  if (!first_sample) return mask;
  mask.probability =
      static_cast<float>(kind == DropoutKind::kAttentionProbabilities ? attention_dropout_ : hidden_dropout_);
  mask.seed = seed_;
  mask.site = dropout_site(first_layer_ + static_cast<int64_t>(l), kind);
  mask.first_sample = *first_sample;
  mask.seq = seq_;
  mask.first_row = sequence_parallel_ ? tp_rank_ * rows_ : 0;
  mask.first_head = tp_rank_ * heads_local_;
  return mask;
}

ConstActivation GptModel::masked_gradient(ConstActivation gradient, const DropoutMask& mask) {
  if (!mask.active()) return gather_rows(gradient, gathered_);
  backend_.dropout(gradient, nullptr, static_cast<std::size_t>(rows_), static_cast<std::size_t>(hidden_), mask,
                   branch_out_);
  return gather_rows(branch_out_, gathered_);
}

void GptModel::layer_forward(std::size_t l, const LayerActivations& act, const std::optional<int64_t>& first_sample,
                             ConstActivation& stream, PendingBranch& pending) {
  const auto batch = static_cast<std::size_t>(batch_);
  const auto seq = static_cast<std::size_t>(seq_);
  const std::size_t count = batch * seq;
  const auto h = static_cast<std::size_t>(hidden_);
  const auto q = static_cast<std::size_t>(q_local_);
  const auto qkv = static_cast<std::size_t>(qkv_local_);
  const auto fc1 = static_cast<std::size_t>(fc1_local_);
  const auto f = static_cast<std::size_t>(ffn_local_);
  const Layer& w = layers_[l];
  const auto bias = [](const Parameter* p) { return p ? p->compute : nullptr; };
  const auto epilogue = [](const Parameter* p) { return p ? GemmEpilogue::kBias : GemmEpilogue::kNone; };
  // A row-parallel layer's bias is added once to the sum: by tensor-parallel rank 0, before it.
  const Parameter* proj_bias = tp_rank_ == 0 ? w.proj_bias : nullptr;
  const Parameter* fc2_bias = tp_rank_ == 0 ? w.fc2_bias : nullptr;
  if (pending.output) {
    norm_forward(stream, pending, act.input, w.ln1_gamma, w.ln1_beta, norm_out_, act.ln1_mean, act.ln1_rstd);
  } else {
    norm_forward(act.input, {}, nullptr, w.ln1_gamma, w.ln1_beta, norm_out_, act.ln1_mean, act.ln1_rstd);
  }
  backend_.linear_forward(gather_rows(norm_out_, gathered_), w.qkv_weight->compute, bias(w.qkv_bias), count, h, qkv,
                          epilogue(w.qkv_bias), act.qkv, nullptr);
  rotate(act.qkv, false);
  backend_.attention_forward(act.qkv, batch, seq, static_cast<std::size_t>(heads_local_),
                             static_cast<std::size_t>(groups_local_), static_cast<std::size_t>(dim_),
                             dropout_mask(DropoutKind::kAttentionProbabilities, l, first_sample), act.attention,
                             act.attention_saved);
  backend_.linear_forward(act.attention, w.proj_weight->compute, bias(proj_bias), count, q, h, epilogue(proj_bias),
                          partial_of(branch_out_), nullptr);
  if (Request done = reduce(branch_out_)) done->wait();
  // Each branch's whole output (after the tensor-parallel sum) goes through its dropout inside the
  // norm (or the stage output's add) that adds it to the stream: Megatron's bias-dropout-add, fused.
  norm_forward(act.input, {branch_out_, dropout_mask(DropoutKind::kAttentionBranch, l, first_sample)}, act.middle,
               w.ln2_gamma, w.ln2_beta, norm_out_, act.ln2_mean, act.ln2_rstd);
  ConstActivation ln2 = gather_rows(norm_out_, gathered_);
  if (swiglu_) {
    backend_.linear_forward(ln2, w.fc1_weight->compute, bias(w.fc1_bias), count, h, fc1, epilogue(w.fc1_bias), act.fc1,
                            nullptr);
    backend_.swiglu_forward(act.fc1, count, f, swiglu_out_);
  } else {
    backend_.linear_forward(ln2, w.fc1_weight->compute, w.fc1_bias->compute, count, h, f, GemmEpilogue::kBiasGelu,
                            act.activated, act.fc1);
  }
  backend_.linear_forward(swiglu_ ? swiglu_out_ : act.activated, w.fc2_weight->compute, bias(fc2_bias), count, f, h,
                          epilogue(fc2_bias), partial_of(branch_out_), nullptr);
  if (Request done = reduce(branch_out_)) done->wait();
  stream = act.middle;
  pending = {branch_out_, dropout_mask(DropoutKind::kMlpBranch, l, first_sample)};
}

void GptModel::layer_backward(std::size_t l, const LayerActivations& act, const std::optional<int64_t>& first_sample,
                              Activation d_out, Activation d_middle, DeferredGradients* deferred) {
  const std::size_t count = static_cast<std::size_t>(batch_ * seq_);
  const auto h = static_cast<std::size_t>(hidden_);
  const auto q = static_cast<std::size_t>(q_local_);
  const auto qkv = static_cast<std::size_t>(qkv_local_);
  const auto fc1 = static_cast<std::size_t>(fc1_local_);
  const auto f = static_cast<std::size_t>(ffn_local_);
  const Layer& w = layers_[l];
  // Under I each GEMM's output gradient is copied out of the scratch buffers the loop reuses and
  // kept for W; under B its weight gradient is taken now. A row-parallel bias's gradient comes from
  // the whole output gradient, so every rank holds the same one.
  const auto weight_gradient = [&](ConstActivation dy, ConstActivation x, std::size_t k, std::size_t n,
                                   Parameter* weight, Parameter* bias, Activation* keep) {
    if (deferred) {
      *keep = backend_.allocate_activation(count * n);
      backend_.copy(dy, count * n, *keep);
    } else {
      backend_.linear_backward(dy, x, weight->compute, count, k, n, nullptr, weight->gradient,
                               bias ? bias->gradient : nullptr);
    }
  };
  DeferredGradients unused;
  DeferredGradients& kept = deferred ? *deferred : unused;
  // out = middle + fc2(act(fc1(ln2(middle)))); with GELU, fc2's input gradient goes through the
  // GELU in the same GEMM; SwiGLU's gradient is a pass of its own, and its output (fc2's input) is
  // not kept but computed again from fc1's for fc2's weight gradient (a pass over tokens x ffn
  // against a tokens x ffn buffer per layer), into d_activated_, which the backward is then done with.
  // The branch's gradient is the output's through the branch's dropout (the residual path's is not).
  ConstActivation d_out_full = masked_gradient(d_out, dropout_mask(DropoutKind::kMlpBranch, l, first_sample));
  ConstActivation fc2_input = act.activated;
  if (swiglu_) {
    backend_.linear_backward(d_out_full, nullptr, w.fc2_weight->compute, count, f, h, d_activated_, nullptr, nullptr);
    backend_.swiglu_backward(d_activated_, act.fc1, count, f, d_ffn_);
    if (!deferred) backend_.swiglu_forward(act.fc1, count, f, d_activated_);
    fc2_input = d_activated_;
  } else {
    backend_.linear_backward_through_gelu(d_out_full, w.fc2_weight->compute, count, f, h, act.fc1, d_ffn_);
  }
  weight_gradient(d_out_full, fc2_input, f, h, w.fc2_weight, w.fc2_bias, &kept.fc2);
  norm_forward(act.middle, {}, nullptr, w.ln2_gamma, w.ln2_beta, norm_out_, act.ln2_mean,
               act.ln2_rstd);  // recomputed, not kept
  ConstActivation ln2_full = gather_rows(norm_out_, gathered_);
  // A column-parallel layer's input gradient is a partial sum: its reduction overlaps the weight gradient.
  backend_.linear_backward(d_ffn_, ln2_full, w.fc1_weight->compute, count, h, fc1, partial_of(d_hidden_), nullptr,
                           nullptr);
  Request summed = reduce(d_hidden_);
  weight_gradient(d_ffn_, ln2_full, h, fc1, w.fc1_weight, w.fc1_bias, &kept.fc1);
  if (summed) summed->wait();
  norm_backward(d_hidden_, act.middle, w.ln2_gamma, w.ln2_beta, act.ln2_mean, act.ln2_rstd, d_out, d_middle);
  // middle = input + proj(attention(rope(qkv(ln1(input))))).
  ConstActivation d_middle_full =
      masked_gradient(d_middle, dropout_mask(DropoutKind::kAttentionBranch, l, first_sample));
  backend_.linear_backward(d_middle_full, act.attention, w.proj_weight->compute, count, q, h, d_hidden_, nullptr,
                           nullptr);
  weight_gradient(d_middle_full, act.attention, q, h, w.proj_weight, w.proj_bias, &kept.proj);
  backend_.attention_backward(d_hidden_, act.qkv, act.attention, act.attention_saved, static_cast<std::size_t>(batch_),
                              static_cast<std::size_t>(seq_), static_cast<std::size_t>(heads_local_),
                              static_cast<std::size_t>(groups_local_), static_cast<std::size_t>(dim_),
                              dropout_mask(DropoutKind::kAttentionProbabilities, l, first_sample), d_qkv_);
  rotate(d_qkv_, true);  // the gradient of the projection's output, before the rotation
  norm_forward(act.input, {}, nullptr, w.ln1_gamma, w.ln1_beta, norm_out_, act.ln1_mean,
               act.ln1_rstd);  // recomputed, not kept
  ConstActivation ln1_full = gather_rows(norm_out_, gathered_);
  backend_.linear_backward(d_qkv_, ln1_full, w.qkv_weight->compute, count, h, qkv, partial_of(d_hidden_), nullptr,
                           nullptr);
  summed = reduce(d_hidden_);
  weight_gradient(d_qkv_, ln1_full, h, qkv, w.qkv_weight, w.qkv_bias, &kept.qkv);
  if (summed) summed->wait();
  // The input's gradient goes to d_out's buffer: it is the previous layer's output gradient.
  norm_backward(d_hidden_, act.input, w.ln1_gamma, w.ln1_beta, act.ln1_mean, act.ln1_rstd, d_middle, d_out);
}

void GptModel::backward_input(int64_t microbatch, ConstActivation output_gradient, float loss_scale,
                              Activation input_gradient, bool defer) {
  Activations a = take(in_flight_, microbatch, "a backward without its forward");
  const auto batch = static_cast<std::size_t>(batch_);
  const auto seq = static_cast<std::size_t>(seq_);
  const std::size_t count = batch * seq;
  const auto rows = static_cast<std::size_t>(rows_);
  const auto h = static_cast<std::size_t>(hidden_);
  const auto v = static_cast<std::size_t>(vocab_local_);
  const auto vocab_start = static_cast<std::size_t>(vocab_start_);
  const auto heads = static_cast<std::size_t>(heads_local_);
  const auto dim = static_cast<std::size_t>(dim_);

  // d_residual_[0] holds the stream's gradient at a layer's output, [1] at its middle.
  Activation d_out = d_residual_[0], d_middle = d_residual_[1];
  if (has_output_) {
    // The loss's gradient overwrites the logits (and waits there for W under I).
    backend_.cross_entropy_backward(a.logits, a.loss_saved, a.labels.data(), a.mask.data(), count, v, vocab_start,
                                    loss_scale, a.logits);
    backend_.linear_backward(a.logits, a.final_norm, output_weight_->compute, count, h, v, partial_of(d_hidden_),
                             nullptr, nullptr);
    Request summed = reduce(d_hidden_);
    if (!defer) {
      backend_.linear_backward(a.logits, a.final_norm, output_weight_->compute, count, h, v, nullptr,
                               output_weight_->gradient, nullptr);
    }
    if (summed) summed->wait();
    norm_backward(d_hidden_, a.output, final_gamma_, final_beta_, a.final_mean, a.final_rstd, nullptr, d_out);
    if (!defer) gradients_done_from(final_gamma_);
  } else {
    backend_.copy(output_gradient, rows * h, d_out);
  }
  if (defer) a.deferred.resize(layers_.size());
  a.work = a.layers;
  for (std::size_t g = groups_.size(); g-- > 0;) {
    const LayerGroup& group = groups_[g];
    const auto first = static_cast<std::size_t>(group.first_layer);
    const auto end = first + static_cast<std::size_t>(group.num_layers);
    std::vector<LayerActivations> borrowed;
    if (group.recomputed) {
      // Full recomputation: the group's forward again, from its kept input, on borrowed buffers.
      ConstActivation stream = a.work[first].input;
      PendingBranch pending;
      for (std::size_t l = first; l < end; ++l) {
        borrowed.push_back(borrow());
        fill_missing(a.work[l], borrowed.back());
        layer_forward(l, a.work[l], a.first_sample, stream, pending);
      }
    }
    for (std::size_t l = end; l-- > first;) {
      if (keep_[l] == Keep::kAllButAttention) {
        // Selective recomputation: the attention core again, from the kept qkv.
        borrowed.push_back(borrow());
        fill_missing(a.work[l], borrowed.back());
        backend_.attention_forward(a.work[l].qkv, batch, seq, heads, static_cast<std::size_t>(groups_local_), dim,
                                   dropout_mask(DropoutKind::kAttentionProbabilities, l, a.first_sample),
                                   a.work[l].attention, a.work[l].attention_saved);
      }
      layer_backward(l, a.work[l], a.first_sample, d_out, d_middle, defer ? &a.deferred[l] : nullptr);
      if (!defer) gradients_done_from(layers_[l].ln1_gamma);
    }
    // W still reads what was recomputed; B is done with it.
    for (LayerActivations& layer : borrowed) {
      if (defer) {
        a.borrowed.push_back(layer);
      } else {
        give_back(layer);
      }
    }
  }
  if (!has_embedding_) {
    backend_.copy(d_out, rows * h, input_gradient);
  } else if (defer) {
    a.input_gradient = backend_.allocate_activation(count * h);  // the embedding's gradient is a weight gradient
    backend_.copy(masked_gradient(d_out, dropout_mask(DropoutKind::kEmbedding, 0, a.first_sample)), count * h,
                  a.input_gradient);
  } else {
    backend_.embedding_backward(masked_gradient(d_out, dropout_mask(DropoutKind::kEmbedding, 0, a.first_sample)),
                                a.inputs.data(), count, seq, h, vocab_start, v, word_embeddings_->gradient,
                                position_embeddings_ ? position_embeddings_->gradient : nullptr);
    gradients_done_from(word_embeddings_);
  }
  if (defer) {
    awaiting_weight_.emplace(microbatch, std::move(a));
  } else {
    spare_.push_back(std::move(a));
  }
}

void GptModel::backward_weight(int64_t microbatch) {
  Activations a = take(awaiting_weight_, microbatch, "W without its I");
  weight_gradients(a);
  for (const DeferredGradients& d : a.deferred) {
    for (Activation buffer : {d.qkv, d.proj, d.fc1, d.fc2}) backend_.release(buffer);
  }
  a.deferred.clear();
  for (LayerActivations& layer : a.borrowed) give_back(layer);
  a.borrowed.clear();
  if (a.input_gradient) backend_.release(a.input_gradient);
  a.input_gradient = nullptr;
  spare_.push_back(std::move(a));
}

void GptModel::weight_gradients(Activations& a) {
  const std::size_t count = static_cast<std::size_t>(batch_ * seq_);
  const auto h = static_cast<std::size_t>(hidden_);
  const auto q = static_cast<std::size_t>(q_local_);
  const auto qkv = static_cast<std::size_t>(qkv_local_);
  const auto fc1 = static_cast<std::size_t>(fc1_local_);
  const auto f = static_cast<std::size_t>(ffn_local_);
  const auto v = static_cast<std::size_t>(vocab_local_);
  const auto gradient = [&](ConstActivation dy, ConstActivation x, std::size_t k, std::size_t n, Parameter* weight,
                            Parameter* bias) {
    backend_.linear_backward(dy, x, weight->compute, count, k, n, nullptr, weight->gradient,
                             bias ? bias->gradient : nullptr);
  };
  // I took the norms' gradients: each part is done with its linear layers'.
  if (has_output_) {
    gradient(a.logits, a.final_norm, h, v, output_weight_, nullptr);
    gradients_done_from(final_gamma_);
  }
  for (std::size_t l = layers_.size(); l-- > 0;) {
    const Layer& w = layers_[l];
    const LayerActivations& act = a.work[l];
    const DeferredGradients& d = a.deferred[l];
    if (swiglu_) backend_.swiglu_forward(act.fc1, count, f, d_activated_);  // fc2's input again
    gradient(d.fc2, swiglu_ ? d_activated_ : act.activated, f, h, w.fc2_weight, w.fc2_bias);
    norm_forward(act.middle, {}, nullptr, w.ln2_gamma, w.ln2_beta, norm_out_, act.ln2_mean, act.ln2_rstd);
    gradient(d.fc1, gather_rows(norm_out_, gathered_), h, fc1, w.fc1_weight, w.fc1_bias);
    gradient(d.proj, act.attention, q, h, w.proj_weight, w.proj_bias);
    norm_forward(act.input, {}, nullptr, w.ln1_gamma, w.ln1_beta, norm_out_, act.ln1_mean, act.ln1_rstd);
    gradient(d.qkv, gather_rows(norm_out_, gathered_), h, qkv, w.qkv_weight, w.qkv_bias);
    gradients_done_from(w.ln1_gamma);
  }
  if (has_embedding_) {
    backend_.embedding_backward(a.input_gradient, a.inputs.data(), count, static_cast<std::size_t>(seq_), h,
                                static_cast<std::size_t>(vocab_start_), v, word_embeddings_->gradient,
                                position_embeddings_ ? position_embeddings_->gradient : nullptr);
    gradients_done_from(word_embeddings_);
  }
}

}  // namespace megaplan::exec
