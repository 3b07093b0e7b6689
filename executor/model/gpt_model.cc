#include "executor/model/gpt_model.h"

#include <cmath>
#include <random>

#include "core/error.h"

namespace megaplan::exec {

namespace {

std::size_t product(const std::vector<int64_t>& shape) {
  std::size_t size = 1;
  for (int64_t extent : shape) size *= static_cast<std::size_t>(extent);
  return size;
}

}  // namespace

int64_t GptModel::predicted_bytes(const ModelSpec& model, int64_t micro_batch_size, const Backend& backend) {
  const int64_t h = model.hidden_size, f = model.effective_ffn_hidden_size(), L = model.num_layers;
  const int64_t s = model.seq_length, v = padded_vocab_size(model, 1), heads = model.num_attention_heads;
  const int64_t tokens = micro_batch_size * s;
  const auto act = static_cast<int64_t>(backend.activation_bytes());
  const int64_t parameters = v * h + s * h + L * (4 * h * h + 2 * f * h + 9 * h + f) + 2 * h;
  const int64_t copy_bytes = act == static_cast<int64_t>(sizeof(float)) ? 0 : act;  // fp32 compute aliases
  const int64_t weights = parameters * (4 * static_cast<int64_t>(sizeof(float)) + copy_bytes);
  const int64_t scratch = act * tokens * (8 * h + f);
  const auto attention_saved = static_cast<int64_t>(backend.attention_saved_size(
      static_cast<std::size_t>(micro_batch_size), static_cast<std::size_t>(s), static_cast<std::size_t>(heads),
      static_cast<std::size_t>(h / heads)));
  const auto loss_saved =
      static_cast<int64_t>(backend.cross_entropy_saved_size(static_cast<std::size_t>(tokens), static_cast<std::size_t>(v)));
  const int64_t activations = act * (L * tokens * (6 * h + 2 * f) + tokens * (2 * h + v)) +
                              static_cast<int64_t>(sizeof(float)) * (L * (4 * tokens + attention_saved) + 2 * tokens + loss_saved);
  return weights + scratch + activations;
}

Parameter& GptModel::add_parameter(const std::string& name, std::vector<int64_t> shape, TensorSplit split, bool decay) {
  Parameter parameter;
  parameter.name = name;
  parameter.size = product(shape);
  parameter.shape = std::move(shape);
  parameter.split = split;
  parameter.weight_decay = decay;
  parameter.value = backend_.allocate(parameter.size);
  parameter.gradient = backend_.allocate(parameter.size);
  parameter.first_moment = backend_.allocate(parameter.size);
  parameter.second_moment = backend_.allocate(parameter.size);
  parameter.compute = backend_.compute_copy(parameter.value, parameter.size);
  parameters_.push_back(std::move(parameter));
  return parameters_.back();
}

GptModel::GptModel(const ModelSpec& model, int64_t micro_batch_size, Backend& backend, uint64_t seed)
    : backend_(backend),
      hidden_(model.hidden_size),
      heads_(model.num_attention_heads),
      layers_count_(model.num_layers),
      ffn_(model.effective_ffn_hidden_size()),
      seq_(model.seq_length),
      vocab_(padded_vocab_size(model, 1)),
      batch_(micro_batch_size) {
  const auto unsupported = [](const std::string& field, const std::string& what) {
    throw SpecError(field, what + " is not in the " + std::string("trainer yet (next executor issue)"));
  };
  if (model.normalization != Normalization::kLayerNorm) unsupported("--normalization", "RMSNorm");
  if (model.position_embedding_type != PositionEmbedding::kLearnedAbsolute) unsupported("--position-embedding-type", "RoPE");
  if (model.swiglu) unsupported("--swiglu", "SwiGLU");
  if (model.effective_num_query_groups() != model.num_attention_heads) unsupported("--num-query-groups", "GQA");
  if (model.untie_embeddings_and_output_weights) unsupported("--untie-embeddings-and-output-weights", "an untied output layer");
  if (!model.add_bias_linear) unsupported("--disable-bias-linear", "linear layers without bias");
  if (model.effective_kv_channels() * heads_ != hidden_) unsupported("--kv-channels", "a head dimension other than h / heads");
  if (micro_batch_size <= 0) throw SpecError("--micro-batch-size", "must be a positive integer");
  const int64_t needed = predicted_bytes(model, micro_batch_size, backend);
  if (const int64_t available = backend.available_bytes(); needed > available) {
    throw SpecError("--micro-batch-size", model.name + " with micro-batch size " + std::to_string(micro_batch_size) +
                                              " needs " + std::to_string(needed) + " bytes on " + backend.name() +
                                              " (weights, gradients, optimizer state and one microbatch's "
                                              "activations) but " + std::to_string(available) + " are available");
  }

  const int64_t h = hidden_;
  parameters_.reserve(static_cast<std::size_t>(4 + 12 * layers_count_));  // pointers into it stay valid
  word_embeddings_ = &add_parameter("embedding.word_embeddings.weight", {vocab_, h}, TensorSplit::kVocabulary, true);
  position_embeddings_ = &add_parameter("embedding.position_embeddings.weight", {seq_, h}, TensorSplit::kReplicated, true);
  for (int64_t l = 0; l < layers_count_; ++l) {
    const std::string prefix = "decoder.layers." + std::to_string(l) + ".";
    Layer layer{};
    layer.ln1_gamma = &add_parameter(prefix + "input_layernorm.weight", {h}, TensorSplit::kReplicated, false);
    layer.ln1_beta = &add_parameter(prefix + "input_layernorm.bias", {h}, TensorSplit::kReplicated, false);
    layer.qkv_weight = &add_parameter(prefix + "self_attention.linear_qkv.weight", {3 * h, h}, TensorSplit::kColumn, true);
    layer.qkv_bias = &add_parameter(prefix + "self_attention.linear_qkv.bias", {3 * h}, TensorSplit::kColumn, false);
    layer.proj_weight = &add_parameter(prefix + "self_attention.linear_proj.weight", {h, h}, TensorSplit::kRow, true);
    layer.proj_bias = &add_parameter(prefix + "self_attention.linear_proj.bias", {h}, TensorSplit::kReplicated, false);
    layer.ln2_gamma = &add_parameter(prefix + "pre_mlp_layernorm.weight", {h}, TensorSplit::kReplicated, false);
    layer.ln2_beta = &add_parameter(prefix + "pre_mlp_layernorm.bias", {h}, TensorSplit::kReplicated, false);
    layer.fc1_weight = &add_parameter(prefix + "mlp.linear_fc1.weight", {ffn_, h}, TensorSplit::kColumn, true);
    layer.fc1_bias = &add_parameter(prefix + "mlp.linear_fc1.bias", {ffn_}, TensorSplit::kColumn, false);
    layer.fc2_weight = &add_parameter(prefix + "mlp.linear_fc2.weight", {h, ffn_}, TensorSplit::kRow, true);
    layer.fc2_bias = &add_parameter(prefix + "mlp.linear_fc2.bias", {h}, TensorSplit::kReplicated, false);
    layers_.push_back(layer);
  }
  final_gamma_ = &add_parameter("decoder.final_layernorm.weight", {h}, TensorSplit::kReplicated, false);
  final_beta_ = &add_parameter("decoder.final_layernorm.bias", {h}, TensorSplit::kReplicated, false);

  // Megatron's initialisation: normal(0, 0.02), output projections scaled by 1 / sqrt(2 L).
  std::mt19937_64 generator(seed);
  const double sigma = 0.02;
  const double output_sigma = sigma / std::sqrt(2.0 * static_cast<double>(layers_count_));
  for (Parameter& parameter : parameters_) {
    std::vector<float> host(parameter.size, 0.0f);
    const bool norm_weight = parameter.name.find("layernorm.weight") != std::string::npos;
    const bool bias = parameter.name.size() >= 4 && parameter.name.compare(parameter.name.size() - 4, 4, "bias") == 0;
    if (norm_weight) {
      std::fill(host.begin(), host.end(), 1.0f);
    } else if (!bias) {
      const bool output = parameter.name.find("linear_proj.weight") != std::string::npos ||
                          parameter.name.find("linear_fc2.weight") != std::string::npos;
      std::normal_distribution<double> normal(0.0, output ? output_sigma : sigma);
      for (float& value : host) value = static_cast<float>(normal(generator));
    }
    backend_.upload(parameter.value, host.data(), parameter.size);
  }
  refresh_compute_weights();

  const auto tokens = static_cast<std::size_t>(batch_ * seq_);
  const auto hs = static_cast<std::size_t>(hidden_);
  norm_out_ = backend_.allocate_activation(tokens * hs);
  branch_out_ = backend_.allocate_activation(tokens * hs);
  d_hidden_ = backend_.allocate_activation(tokens * hs);
  d_residual_[0] = backend_.allocate_activation(tokens * hs);
  d_residual_[1] = backend_.allocate_activation(tokens * hs);
  d_qkv_ = backend_.allocate_activation(tokens * 3 * hs);
  d_ffn_ = backend_.allocate_activation(tokens * static_cast<std::size_t>(ffn_));
}

GptModel::~GptModel() {
  for (auto& [microbatch, activations] : in_flight_) release_activations(activations);
  for (Activations& activations : spare_) release_activations(activations);
  for (Parameter& parameter : parameters_) {
    backend_.release_compute_copy(parameter.compute, parameter.value);
    for (float* buffer : {parameter.value, parameter.gradient, parameter.first_moment, parameter.second_moment}) {
      backend_.release(buffer);
    }
  }
  for (Activation buffer : {norm_out_, branch_out_, d_hidden_, d_residual_[0], d_residual_[1], d_qkv_, d_ffn_}) {
    backend_.release(buffer);
  }
}

std::vector<OptimizerTensor> GptModel::optimizer_tensors(double weight_decay) const {
  std::vector<OptimizerTensor> tensors;
  tensors.reserve(parameters_.size());
  for (const Parameter& p : parameters_) {
    tensors.push_back({p.value, p.gradient, p.first_moment, p.second_moment, p.compute, p.size,
                       p.weight_decay ? weight_decay : 0.0});
  }
  return tensors;
}

void GptModel::refresh_compute_weights() {
  for (Parameter& p : parameters_) backend_.refresh_compute_copy(p.value, p.size, p.compute);
}

GptModel::Activations GptModel::allocate_activations() {
  if (!spare_.empty()) {
    Activations reused = std::move(spare_.back());
    spare_.pop_back();
    return reused;
  }
  const auto tokens = static_cast<std::size_t>(batch_ * seq_);
  const auto h = static_cast<std::size_t>(hidden_);
  const auto f = static_cast<std::size_t>(ffn_);
  const auto stats = [&] { return backend_.allocate(tokens); };
  const auto act = [&](std::size_t n) { return backend_.allocate_activation(n); };
  Activations a;
  for (int64_t l = 0; l < layers_count_; ++l) {
    LayerActivations layer{};
    layer.input = act(tokens * h);
    layer.qkv = act(tokens * 3 * h);
    layer.attention = act(tokens * h);
    layer.middle = act(tokens * h);
    layer.fc1 = act(tokens * f);
    layer.gelu = act(tokens * f);
    layer.ln1_mean = stats();
    layer.ln1_rstd = stats();
    layer.ln2_mean = stats();
    layer.ln2_rstd = stats();
    layer.attention_saved = backend_.allocate(backend_.attention_saved_size(
        static_cast<std::size_t>(batch_), static_cast<std::size_t>(seq_), static_cast<std::size_t>(heads_),
        static_cast<std::size_t>(hidden_ / heads_)));
    a.layers.push_back(layer);
  }
  a.output = act(tokens * h);
  a.final_norm = act(tokens * h);
  a.logits = act(tokens * static_cast<std::size_t>(vocab_));
  a.final_mean = stats();
  a.final_rstd = stats();
  a.loss_saved = backend_.allocate(backend_.cross_entropy_saved_size(tokens, static_cast<std::size_t>(vocab_)));
  return a;
}

void GptModel::release_activations(Activations& a) {
  for (LayerActivations& l : a.layers) {
    for (Activation buffer : {l.input, l.qkv, l.attention, l.middle, l.fc1, l.gelu}) {
      backend_.release(buffer);
    }
    for (float* buffer : {l.ln1_mean, l.ln1_rstd, l.attention_saved, l.ln2_mean, l.ln2_rstd}) backend_.release(buffer);
  }
  for (Activation buffer : {a.output, a.final_norm, a.logits}) backend_.release(buffer);
  for (float* buffer : {a.final_mean, a.final_rstd, a.loss_saved}) backend_.release(buffer);
  a.layers.clear();
}

double GptModel::run_forward(Activations& a, const std::vector<int64_t>& tokens, const std::vector<float>& mask) {
  const auto batch = static_cast<std::size_t>(batch_);
  const auto seq = static_cast<std::size_t>(seq_);
  const std::size_t count = batch * seq;
  if (tokens.size() != batch * (seq + 1) || mask.size() != count) {
    throw SpecError("--micro-batch-size", "a microbatch needs " + std::to_string(batch * (seq + 1)) + " tokens, got " +
                                              std::to_string(tokens.size()));
  }
  a.inputs.resize(count);
  a.labels.resize(count);
  for (std::size_t b = 0; b < batch; ++b) {
    for (std::size_t s = 0; s < seq; ++s) {
      const int64_t input = tokens[b * (seq + 1) + s];
      const int64_t label = tokens[b * (seq + 1) + s + 1];
      if (input < 0 || input >= vocab_ || label < 0 || label >= vocab_) {
        throw SpecError("--data-path", "token " + std::to_string(std::max(input, label)) +
                                           " is outside the model's padded vocabulary of " + std::to_string(vocab_));
      }
      a.inputs[b * seq + s] = input;
      a.labels[b * seq + s] = label;
    }
  }
  a.mask = mask;
  const auto h = static_cast<std::size_t>(hidden_);
  const auto f = static_cast<std::size_t>(ffn_);
  const auto heads = static_cast<std::size_t>(heads_);
  const auto v = static_cast<std::size_t>(vocab_);
  // The residual stream: x_{l+1} = middle_l + mlp(ln2(middle_l)), middle_l = x_l + attention(ln1(x_l)).
  // Each branch's output waits in branch_out_ until the next norm adds it to the stream.
  Activation stream = a.layers.empty() ? a.output : a.layers[0].input;
  backend_.embedding_forward(a.inputs.data(), count, seq, word_embeddings_->compute, position_embeddings_->compute, h,
                             stream);
  ConstActivation pending = nullptr;  // the branch output not yet added to `stream`
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const Layer& w = layers_[l];
    LayerActivations& act = a.layers[l];
    if (pending) {
      backend_.layernorm_forward(stream, pending, act.input, w.ln1_gamma->compute, w.ln1_beta->compute, count, h,
                                 norm_out_, act.ln1_mean, act.ln1_rstd);
    } else {
      backend_.layernorm_forward(act.input, nullptr, nullptr, w.ln1_gamma->compute, w.ln1_beta->compute, count, h,
                                 norm_out_, act.ln1_mean, act.ln1_rstd);
    }
    backend_.linear_forward(norm_out_, w.qkv_weight->compute, w.qkv_bias->compute, count, h, 3 * h,
                            LinearEpilogue::kBias, act.qkv, nullptr);
    backend_.attention_forward(act.qkv, batch, seq, heads, h / heads, act.attention, act.attention_saved);
    backend_.linear_forward(act.attention, w.proj_weight->compute, w.proj_bias->compute, count, h, h,
                            LinearEpilogue::kBias, branch_out_, nullptr);
    backend_.layernorm_forward(act.input, branch_out_, act.middle, w.ln2_gamma->compute, w.ln2_beta->compute, count, h,
                               norm_out_, act.ln2_mean, act.ln2_rstd);
    backend_.linear_forward(norm_out_, w.fc1_weight->compute, w.fc1_bias->compute, count, h, f,
                            LinearEpilogue::kBiasGelu, act.gelu, act.fc1);
    backend_.linear_forward(act.gelu, w.fc2_weight->compute, w.fc2_bias->compute, count, f, h, LinearEpilogue::kBias,
                            branch_out_, nullptr);
    stream = act.middle;
    pending = branch_out_;
  }
  backend_.layernorm_forward(stream, pending, pending ? a.output : nullptr, final_gamma_->compute,
                             final_beta_->compute, count, h, a.final_norm, a.final_mean, a.final_rstd);
  // Tied output layer: logits = final_norm E^T.
  backend_.linear_forward(a.final_norm, word_embeddings_->compute, nullptr, count, h, v, LinearEpilogue::kNone,
                          a.logits, nullptr);
  return backend_.cross_entropy_forward(a.logits, a.labels.data(), a.mask.data(), count, v, a.loss_saved);
}

double GptModel::forward(int64_t microbatch, const std::vector<int64_t>& tokens, const std::vector<float>& loss_mask) {
  Activations activations = allocate_activations();
  const double loss = run_forward(activations, tokens, loss_mask);
  in_flight_[microbatch] = std::move(activations);
  return loss;
}

double GptModel::evaluate(const std::vector<int64_t>& tokens, const std::vector<float>& loss_mask) {
  Activations activations = allocate_activations();
  const double loss = run_forward(activations, tokens, loss_mask);
  spare_.push_back(std::move(activations));
  return loss;
}

void GptModel::backward(int64_t microbatch, float loss_scale) {
  const auto found = in_flight_.find(microbatch);
  if (found == in_flight_.end()) throw std::logic_error("GptModel::backward without its forward");
  Activations a = std::move(found->second);
  in_flight_.erase(found);
  const auto batch = static_cast<std::size_t>(batch_);
  const auto seq = static_cast<std::size_t>(seq_);
  const std::size_t count = batch * seq;
  const auto h = static_cast<std::size_t>(hidden_);
  const auto f = static_cast<std::size_t>(ffn_);
  const auto v = static_cast<std::size_t>(vocab_);
  const auto heads = static_cast<std::size_t>(heads_);

  // The loss's gradient overwrites the logits.
  backend_.cross_entropy_backward(a.logits, a.loss_saved, a.labels.data(), a.mask.data(), count, v, loss_scale,
                                  a.logits);
  backend_.linear_backward(a.logits, a.final_norm, word_embeddings_->compute, count, h, v, d_hidden_,
                           word_embeddings_->gradient, nullptr);
  // d_residual_[0] holds the stream's gradient at a layer's output, [1] at its middle.
  Activation d_out = d_residual_[0], d_middle = d_residual_[1];
  backend_.layernorm_backward(d_hidden_, a.output, final_gamma_->compute, a.final_mean, a.final_rstd, count, h,
                              nullptr, d_out, final_gamma_->gradient, final_beta_->gradient);
  for (std::size_t l = layers_.size(); l-- > 0;) {
    const Layer& w = layers_[l];
    const LayerActivations& act = a.layers[l];
    // out = middle + fc2(gelu(fc1(ln2(middle)))); fc2's input gradient goes through the GELU in
    // the same GEMM.
    backend_.linear_gelu_backward(d_out, act.gelu, w.fc2_weight->compute, count, f, h, act.fc1, d_ffn_,
                                  w.fc2_weight->gradient, w.fc2_bias->gradient);
    backend_.layernorm_forward(act.middle, nullptr, nullptr, w.ln2_gamma->compute, w.ln2_beta->compute, count, h,
                               norm_out_, act.ln2_mean, act.ln2_rstd);  // recomputed, not kept
    backend_.linear_backward(d_ffn_, norm_out_, w.fc1_weight->compute, count, h, f, d_hidden_, w.fc1_weight->gradient,
                             w.fc1_bias->gradient);
    backend_.layernorm_backward(d_hidden_, act.middle, w.ln2_gamma->compute, act.ln2_mean, act.ln2_rstd, count, h,
                                d_out, d_middle, w.ln2_gamma->gradient, w.ln2_beta->gradient);
    // middle = input + proj(attention(qkv(ln1(input)))).
    backend_.linear_backward(d_middle, act.attention, w.proj_weight->compute, count, h, h, d_hidden_,
                             w.proj_weight->gradient, w.proj_bias->gradient);
    backend_.attention_backward(d_hidden_, act.qkv, act.attention, act.attention_saved, batch, seq, heads, h / heads,
                                d_qkv_);
    backend_.layernorm_forward(act.input, nullptr, nullptr, w.ln1_gamma->compute, w.ln1_beta->compute, count, h,
                               norm_out_, act.ln1_mean, act.ln1_rstd);  // recomputed, not kept
    backend_.linear_backward(d_qkv_, norm_out_, w.qkv_weight->compute, count, h, 3 * h, d_hidden_,
                             w.qkv_weight->gradient, w.qkv_bias->gradient);
    // The input's gradient goes to d_out's buffer: it is the previous layer's output gradient.
    backend_.layernorm_backward(d_hidden_, act.input, w.ln1_gamma->compute, act.ln1_mean, act.ln1_rstd, count, h,
                                d_middle, d_out, w.ln1_gamma->gradient, w.ln1_beta->gradient);
  }
  backend_.embedding_backward(d_out, a.inputs.data(), count, seq, h, word_embeddings_->gradient,
                              position_embeddings_->gradient);
  spare_.push_back(std::move(a));
}

void GptModel::zero_gradients() {
  for (Parameter& parameter : parameters_) backend_.fill(parameter.gradient, parameter.size, 0.0f);
}

}  // namespace megaplan::exec
