// Hugging Face config.json import. Field names follow transformers' LlamaConfig, MistralConfig,
// MixtralConfig, Qwen2Config, Qwen2MoeConfig, Qwen3Config, Qwen3MoeConfig and GPT2Config; defaults are those classes'
// defaults where the file omits a field.
#include "core/hf_config.h"

#include <algorithm>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/checked_math.h"
#include "core/error.h"
#include "core/input_limits.h"
#include "core/json_io.h"
#include "core/model_presets.h"

namespace megaplan {

namespace {

// The causal language models megaplan reads, by transformers' class name.
struct Architecture {
  const char* class_name;
  const char* model_type;
};
constexpr Architecture kArchitectures[] = {{"LlamaForCausalLM", "llama"},        {"MistralForCausalLM", "mistral"},
                                           {"MixtralForCausalLM", "mixtral"},    {"Qwen2ForCausalLM", "qwen2"},
                                           {"Qwen2MoeForCausalLM", "qwen2_moe"}, {"Qwen3ForCausalLM", "qwen3"},
                                           {"Qwen3MoeForCausalLM", "qwen3_moe"}, {"GPT2LMHeadModel", "gpt2"}};

// The model type `architectures` names (every class one type's), or "" when it names none.
std::string type_of_architectures(JsonFieldReader& reader) {
  const nlohmann::json* classes = reader.read_array("architectures");
  if (!classes) return "";
  std::string type;
  for (const nlohmann::json& name : *classes) {
    const auto known = std::find_if(std::begin(kArchitectures), std::end(kArchitectures),
                                    [&](const Architecture& a) { return name == a.class_name; });
    if (known == std::end(kArchitectures)) {
      throw SpecError(reader.field("architectures"),
                      name.dump() +
                          " is not a model megaplan reads (the causal language models of llama, mistral, "
                          "mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe and gpt2)");
    }
    if (!type.empty() && type != known->model_type) {
      throw SpecError(reader.field("architectures"),
                      "names models of two types, " + type + " and " + known->model_type);
    }
    type = known->model_type;
  }
  return type;
}

// The model type: model_type, which `architectures` must agree with, else the type `architectures`
// names, else what the keys say (GPT-2's n_layer, the Llama family's num_hidden_layers). Models of
// other types whose keys are all the Llama family's (OLMo 2's) can only be told by one of the two.
std::string model_type_of(JsonFieldReader& reader) {
  std::string type;
  const bool typed = reader.read("model_type", type);
  if (typed && std::none_of(std::begin(kArchitectures), std::end(kArchitectures),
                            [&](const Architecture& a) { return type == a.model_type; })) {
    throw SpecError(reader.field("model_type"), "unsupported \"" + type +
                                                    "\"; supported: llama, mistral, mixtral, qwen2, qwen2_moe, "
                                                    "qwen3, qwen3_moe, gpt2");
  }
  const std::string named = type_of_architectures(reader);
  if (typed) {
    // Mixtral's experts under "mistral" are found by their keys; a class of another type is not.
    const bool alike = named == type || (type == "mistral" && named == "mixtral");
    if (!named.empty() && !alike) {
      throw SpecError(reader.field("architectures"), "names a " + named + " model, but model_type is \"" + type + "\"");
    }
    return type;
  }
  if (!named.empty()) return named;
  if (reader.has("n_layer") && reader.has("n_embd")) return "gpt2";
  if (reader.has("num_hidden_layers")) return "llama";
  return "";
}

// Llama 3.1's scaling from a rope_scaling or rope_parameters object; transformers' other kinds
// (linear, dynamic, yarn, longrope) change the frequencies otherwise, and training with plain RoPE
// would silently differ from the model.
void read_rope_scaling(JsonFieldReader& reader, const std::string& key, ModelSpec& spec) {
  const nlohmann::json* object = reader.read_object(key);
  if (object == nullptr) return;
  JsonFieldReader scaling(*object, reader.field(key));
  scaling.read("rope_theta", spec.rotary_base);
  scaling.read("partial_rotary_factor", spec.rotary_percent);
  std::string kind;
  if (!scaling.read("rope_type", kind) && !scaling.read("type", kind)) {
    // transformers reads a scaling without its kind as no scaling at all; a factor there was meant.
    if (scaling.has("factor")) {
      throw SpecError(scaling.field("factor"),
                      "a RoPE scaling without rope_type (or type): \"llama3\" (Llama 3.1's) is the one modelled");
    }
    return;
  }
  if (kind == "default") return;
  if (kind != "llama3") {
    throw SpecError(scaling.field("rope_type"),
                    "only \"llama3\" (Llama 3.1's scaling) is modelled, got \"" + kind + "\"");
  }
  scaling.require("factor", spec.rope_scaling.factor);
  require_rope_scaling_factor(spec.rope_scaling.factor, scaling.field("factor"));
  scaling.require("low_freq_factor", spec.rope_scaling.low_freq_factor);
  scaling.require("high_freq_factor", spec.rope_scaling.high_freq_factor);
  scaling.require("original_max_position_embeddings", spec.rope_scaling.original_max_position_embeddings);
}

// Keys that change the architecture in ways megaplan does not model, whatever model_type says (a
// Mixtral config without model_type, or named "mistral", must not read as a dense model): present
// and not null, false or 0, each is refused naming the key and the feature.
struct UnmodelledKey {
  const char* key;
  const char* feature;
};
constexpr UnmodelledKey kUnmodelledKeys[] = {
    {"num_experts", "Qwen's mixture of experts is read under model_type \"qwen2_moe\" or \"qwen3_moe\" only"},
    {"n_routed_experts", "mixture of experts (DeepSeek's) is not modelled yet (issue 40)"},
    {"num_experts_per_tok", "mixture of experts is read for Mixtral (num_local_experts), qwen2_moe and qwen3_moe only"},
    {"moe_intermediate_size", "mixture of experts is read for qwen2_moe and qwen3_moe only"},
    {"shared_expert_intermediate_size", "a shared expert is read for qwen2_moe only"},
    {"n_shared_experts", "mixture of experts (DeepSeek's shared experts) is not modelled yet (issue 40)"},
    {"router_jitter_noise", "router input jitter is not modelled (Megatron's --moe-input-jitter-eps)"},
    {"q_lora_rank", "multi-head latent attention (DeepSeek's MLA) is not modelled"},
    {"kv_lora_rank", "multi-head latent attention (DeepSeek's MLA) is not modelled"},
    {"mlp_bias", "biases on the MLP's projections are not modelled for the Llama family"},
    {"add_cross_attention", "cross-attention layers (an encoder's outputs attended to) are not modelled"},
    {"is_encoder_decoder", "encoder-decoder models are not modelled (megaplan's are decoders)"},
    {"scale_attn_by_inverse_layer_idx", "attention scores scaled by 1 / (layer + 1) are not modelled"},
};

// Keys a config holds that do not change the model megaplan builds, trains and costs, each with
// the reason. With the keys the importer reads and kUnmodelledKeys this is every key of
// transformers' config classes of the types read and refused (tests/core/hf_config_keys_test.cc
// checks it against tests/data/hf_default_configs.json): any other key is refused, since it may change
// the model.
struct IgnoredKey {
  const char* key;
  const char* reason;
};
constexpr const char* kTokenizerKey =
    "the tokenizer's special token: convert carries it, the model does not depend on it";
constexpr const char* kDropoutKey = "dropout is a training setting: train's --attention-dropout and --hidden-dropout";
constexpr const char* kOutputsKey = "what transformers' forward returns, not the model";
constexpr const char* kClassifierKey = "a head of transformers' classification models, not the language model";
constexpr IgnoredKey kIgnoredKeys[] = {
    {"architectures", "the class names transformers builds: model_type and the other keys say the architecture"},
    {"transformers_version", "bookkeeping"},
    {"dtype", "the weights' storage type: convert's --dtype and train's precision decide megaplan's"},
    {"torch_dtype", "as dtype (its name before transformers 4.56)"},
    {"bos_token_id", kTokenizerKey},
    {"eos_token_id", kTokenizerKey},
    {"pad_token_id", kTokenizerKey},
    {"use_cache", "inference's key-value cache"},
    {"initializer_range", "the initialisation's spread: train's --init-method-std (0.02 by default, as here)"},
    {"attention_dropout", kDropoutKey},
    {"attn_pdrop", kDropoutKey},
    {"resid_pdrop", kDropoutKey},
    {"embd_pdrop", kDropoutKey},
    {"output_attentions", kOutputsKey},
    {"output_hidden_states", kOutputsKey},
    {"return_dict", kOutputsKey},
    {"id2label", kClassifierKey},
    {"label2id", kClassifierKey},
    {"problem_type", kClassifierKey},
    {"summary_type", kClassifierKey},
    {"summary_use_proj", kClassifierKey},
    {"summary_activation", kClassifierKey},
    {"summary_proj_to_labels", kClassifierKey},
    {"summary_first_dropout", kClassifierKey},
    {"chunk_size_feed_forward", "transformers' feed-forward in chunks: the same sums in pieces"},
    {"pretraining_tp", "Llama's pretraining split of its projections: the same sums in pieces"},
    {"reorder_and_upcast_attn", "GPT-2's attention in fp32 inside transformers: numerics, not the model"},
    {"use_sliding_window", "read with sliding_window (a window shorter than the context is refused)"},
    {"max_window_layers", "the layers a sliding window applies to, which only use_sliding_window turns on"},
};

bool is_set(const nlohmann::json& value) {
  if (value.is_null()) return false;
  if (value.is_boolean()) return value.get<bool>();
  if (value.is_number()) return value.get<double>() != 0;
  return true;
}

bool is_qwen_moe(const std::string& type) { return type == "qwen2_moe" || type == "qwen3_moe"; }

// Mixtral's experts (MixtralConfig: num_local_experts, num_experts_per_tok), whatever the type says
// but Qwen's mixtures' (transformers 5 saves Qwen3-MoE's num_experts as num_local_experts).
bool has_mixtral_experts(const nlohmann::json& json, const std::string& type) {
  const auto experts = json.find("num_local_experts");
  return type == "mixtral" || (!is_qwen_moe(type) && experts != json.end() && is_set(*experts));
}

// The keys of kUnmodelledKeys that `type` models: Mixtral's top k; Qwen2-MoE's experts and shared
// expert; Qwen3-MoE's experts (it has no shared expert).
bool models_key(const std::string& type, bool mixtral, std::string_view key) {
  if (mixtral) return key == "num_experts_per_tok";
  if (is_qwen_moe(type)) {
    return key == "num_experts" || key == "num_experts_per_tok" || key == "moe_intermediate_size" ||
           (type == "qwen2_moe" && key == "shared_expert_intermediate_size");
  }
  return false;
}

bool is_qwen3(const std::string& type) { return type == "qwen3" || type == "qwen3_moe"; }

void refuse_unmodelled_keys(const nlohmann::json& json, JsonFieldReader& reader, const std::string& type,
                            bool mixtral) {
  for (const UnmodelledKey& unmodelled : kUnmodelledKeys) {
    if (models_key(type, mixtral, unmodelled.key)) continue;
    if (const auto found = json.find(unmodelled.key); found != json.end() && is_set(*found)) {
      throw SpecError(
          reader.field(unmodelled.key),
          std::string(unmodelled.feature) + "; this config's model is not the dense decoder megaplan would read it as");
    }
    reader.ignore(unmodelled.key);  // absent, or off
  }
  // transformers 5's attention per layer: sliding-window layers attend to less than megaplan does.
  if (const nlohmann::json* layer_types = reader.read_array("layer_types")) {
    for (std::size_t layer = 0; layer < layer_types->size(); ++layer) {
      if ((*layer_types)[layer] != "full_attention") {
        throw SpecError(reader.field("layer_types"),
                        "layer " + std::to_string(layer) + " is " + (*layer_types)[layer].dump() +
                            ": only \"full_attention\" is modelled (megaplan attends over the whole sequence)");
      }
    }
  }
  reader.ignore("sliding_window");  // checked below
  // A sliding window shorter than the context attends less than megaplan's causal attention over the
  // whole sequence (Mistral v0.1's 4096 of 32768); Qwen2's applies only with use_sliding_window.
  const auto window = json.find("sliding_window");
  if (window == json.end() || !window->is_number() ||
      (json.contains("use_sliding_window") && !is_set(json["use_sliding_window"])))
    return;
  const auto context = json.find("max_position_embeddings");
  if (context != json.end() && context->is_number() && window->get<double>() >= context->get<double>()) return;
  throw SpecError(reader.field("sliding_window"),
                  "sliding-window attention is not modelled (megaplan attends over the whole sequence): " +
                      window->dump() + " tokens against max_position_embeddings " +
                      (context != json.end() ? context->dump() : std::string("(absent)")) +
                      "; a window as long as the context (or null) is whole-sequence attention");
}

ModelSpec from_llama_family(JsonFieldReader& reader, const std::string& type) {
  std::string activation = "silu";
  reader.read("hidden_act", activation);
  if (activation != "silu") {
    throw SpecError(reader.field("hidden_act"),
                    "only \"silu\" (SwiGLU) is supported for " + type + ", got \"" + activation + "\"");
  }
  ModelSpec spec;
  reader.require("num_hidden_layers", spec.num_layers);
  reader.require("hidden_size", spec.hidden_size);
  // Counts and widths a config states: 0 is no "unset" (transformers would build a broken model).
  reader.require("intermediate_size", spec.ffn_hidden_size);
  require_positive(spec.ffn_hidden_size, reader.field("intermediate_size"));
  reader.require("num_attention_heads", spec.num_attention_heads);
  spec.num_query_groups = spec.num_attention_heads;
  if (reader.read("num_key_value_heads", spec.num_query_groups)) {
    require_positive(spec.num_query_groups, reader.field("num_key_value_heads"));
  }
  // Qwen3Config's head_dim defaults to 128 whatever the width (Qwen3-30B-A3B: 32 heads of 128 over
  // a hidden size of 2048); the others' to hidden_size / num_attention_heads.
  if (is_qwen3(type)) spec.kv_channels = 128;
  if (reader.read("head_dim", spec.kv_channels)) require_positive(spec.kv_channels, reader.field("head_dim"));
  reader.require("max_position_embeddings", spec.max_position_embeddings);
  spec.seq_length = spec.max_position_embeddings;
  reader.require("vocab_size", spec.vocab_size);
  spec.swiglu = true;
  spec.normalization = Normalization::kRMSNorm;
  spec.position_embedding_type = PositionEmbedding::kRope;
  bool tied = false;  // LlamaConfig's, MistralConfig's and Qwen2Config's default
  reader.read("tie_word_embeddings", tied);
  spec.untie_embeddings_and_output_weights = !tied;
  spec.add_bias_linear = false;
  // Qwen2 always has QKV biases; Llama's attention_bias puts biases on q, k, v (and o).
  bool attention_bias = false;
  reader.read("attention_bias", attention_bias);
  bool qkv_bias = true;  // Qwen2MoeConfig's default (its older files omit the key: always biases)
  if (type == "qwen2_moe") reader.read("qkv_bias", qkv_bias);
  spec.add_qkv_bias = type == "qwen2" || (type == "qwen2_moe" && qkv_bias) || attention_bias;
  // Qwen3 normalises each query and key head (q_norm, k_norm: RMSNorm over head_dim) before RoPE.
  spec.qk_layernorm = is_qwen3(type);
  spec.norm_epsilon = 1e-6;  // the three configs' rms_norm_eps default
  reader.read("rms_norm_eps", spec.norm_epsilon);
  reader.read("rope_theta", spec.rotary_base);  // default 10000, as Megatron's
  reader.read("partial_rotary_factor", spec.rotary_percent);
  // The scaling: transformers 4's rope_scaling, or transformers 5's rope_parameters (which also
  // holds rope_theta; its rope_type "default" is no scaling).
  read_rope_scaling(reader, "rope_scaling", spec);
  read_rope_scaling(reader, "rope_parameters", spec);
  return spec;
}

ModelSpec from_gpt2(JsonFieldReader& reader) {
  ModelSpec spec;  // GPT2Config's defaults where the file omits a field
  reader.require("n_layer", spec.num_layers);
  reader.require("n_embd", spec.hidden_size);
  // null means 4h; 0 is no "unset"
  if (reader.read("n_inner", spec.ffn_hidden_size)) require_positive(spec.ffn_hidden_size, reader.field("n_inner"));
  reader.require("n_head", spec.num_attention_heads);
  spec.max_position_embeddings = 1024;
  reader.read("n_positions", spec.max_position_embeddings);
  spec.seq_length = spec.max_position_embeddings;
  reader.read("n_ctx", spec.seq_length);
  spec.vocab_size = 50257;
  reader.read("vocab_size", spec.vocab_size);
  bool tied = true;
  reader.read("tie_word_embeddings", tied);
  spec.untie_embeddings_and_output_weights = !tied;
  reader.read("layer_norm_epsilon", spec.norm_epsilon);  // GPT2Config's default 1e-5, Megatron's too
  // megaplan's GELU is the tanh approximation, GPT-2's own.
  std::string activation = "gelu_new";
  reader.read("activation_function", activation);
  if (activation != "gelu_new" && activation != "gelu_pytorch_tanh") {
    throw SpecError(
        reader.field("activation_function"),
        "only GELU's tanh approximation (\"gelu_new\", \"gelu_pytorch_tanh\") is modelled, got \"" + activation + "\"");
  }
  bool scaled = true;
  reader.read("scale_attn_weights", scaled);
  if (!scaled) {
    throw SpecError(reader.field("scale_attn_weights"),
                    "attention scores not scaled by 1 / sqrt(head dim) are not modelled");
  }
  return spec;  // LayerNorm, GELU, learned positions, biases: Megatron's GPT defaults
}

// The router's loss as transformers trains these models: router_aux_loss_coef times the switch
// loss, added only under output_router_logits (MixtralConfig's and Qwen2MoeConfig's default: off).
void read_router_loss(JsonFieldReader& reader, double default_coefficient, MoeSpec& moe) {
  bool output_router_logits = false;
  reader.read("output_router_logits", output_router_logits);
  double coefficient = default_coefficient;
  reader.read("router_aux_loss_coef", coefficient);
  moe.aux_loss_coeff = output_router_logits ? coefficient : 0;
}

// Qwen2-MoE and Qwen3-MoE: layer i holds experts unless listed in mlp_only_layers, when (i + 1) is
// a multiple of decoder_sparse_step; Qwen2-MoE's MoE layers each a shared expert behind a sigmoid
// gate (Qwen3-MoE's none); top k over the softmax of every expert, renormalised over the k only
// under norm_topk_prob (Megatron's softmax after the choice: the same probabilities). Defaults are
// Qwen2MoeConfig's and Qwen3MoeConfig's.
void read_qwen_moe(JsonFieldReader& reader, const std::string& type, ModelSpec& spec) {
  MoeSpec& moe = spec.moe;
  const bool qwen3 = type == "qwen3_moe";
  moe.num_experts = qwen3 ? 128 : 60;
  moe.router_topk = qwen3 ? 8 : 4;
  moe.ffn_hidden_size = qwen3 ? 768 : 1408;
  moe.shared_expert_intermediate_size = qwen3 ? 0 : 5632;
  // num_experts, or its name as transformers 5 saves it (its configs' attribute_map).
  const bool named = reader.read("num_experts", moe.num_experts);
  if (int64_t alias = 0; reader.read("num_local_experts", alias)) {
    if (named && alias != moe.num_experts) {
      throw SpecError(reader.field("num_local_experts"), std::to_string(alias) + " disagrees with num_experts " +
                                                             std::to_string(moe.num_experts) + ", its other name");
    }
    moe.num_experts = alias;
  }
  reader.read("num_experts_per_tok", moe.router_topk);
  reader.read("moe_intermediate_size", moe.ffn_hidden_size);
  if (!qwen3) reader.read("shared_expert_intermediate_size", moe.shared_expert_intermediate_size);
  moe.shared_expert_gate = moe.shared_expert_intermediate_size > 0;
  bool norm_topk_prob = false;
  reader.read("norm_topk_prob", norm_topk_prob);
  moe.router_pre_softmax = !norm_topk_prob;
  read_router_loss(reader, 0.001, moe);
  int64_t step = 1;
  reader.read("decoder_sparse_step", step);
  if (step < 1) throw SpecError(reader.field("decoder_sparse_step"), "must be at least 1, got " + std::to_string(step));
  std::vector<int64_t> dense_layers;
  reader.read("mlp_only_layers", dense_layers);
  if (step == 1 && dense_layers.empty()) return;  // every layer: Megatron's --moe-layer-freq 1
  // The pattern has an entry per layer: the count is checked before it sizes anything.
  require_positive(spec.num_layers, reader.field("num_hidden_layers"));
  require_at_most(spec.num_layers, kMaxLayers, reader.field("num_hidden_layers"));
  moe.layer_pattern.assign(static_cast<std::size_t>(spec.num_layers), 0);
  for (int64_t layer = 0; layer < spec.num_layers; ++layer) {
    moe.layer_pattern[static_cast<std::size_t>(layer)] = (layer + 1) % step == 0 ? 1 : 0;
  }
  for (int64_t layer : dense_layers) {
    if (layer < 0 || layer >= spec.num_layers) {
      throw SpecError(reader.field("mlp_only_layers"),
                      "names layer " + std::to_string(layer) + " of " + std::to_string(spec.num_layers));
    }
    moe.layer_pattern[static_cast<std::size_t>(layer)] = 0;
  }
}

}  // namespace

bool is_hf_config(const nlohmann::json& json) {
  return json.is_object() && (json.contains("model_type") || json.contains("architectures") ||
                              json.contains("num_hidden_layers") || json.contains("n_layer"));
}

ModelSpec model_spec_from_hf_config(const nlohmann::json& json, const std::string& source) {
  // HF configs hold many fields megaplan does not model: unknown keys are fine here (no
  // reject_unknown_keys), but the fields read must have the right types.
  JsonFieldReader reader(json, source);
  const std::string type = model_type_of(reader);
  const bool mixtral = has_mixtral_experts(json, type);
  refuse_unmodelled_keys(json, reader, type, mixtral);
  ModelSpec spec;
  if (type == "llama" || type == "mistral" || type == "mixtral" || type == "qwen2" || type == "qwen2_moe" ||
      is_qwen3(type)) {
    spec = from_llama_family(reader, type);
  } else if (type == "gpt2") {
    spec = from_gpt2(reader);
  } else {
    throw SpecError(reader.field("model_type"), "unsupported \"" + type +
                                                    "\"; supported: llama, mistral, mixtral, qwen2, qwen2_moe, "
                                                    "qwen3, qwen3_moe, gpt2");
  }
  if (mixtral) {  // every MLP Mixtral's experts of intermediate_size (MixtralConfig's defaults 8 and 2)
    spec.moe.num_experts = 8;
    spec.moe.router_topk = 2;
    reader.read("num_local_experts", spec.moe.num_experts);
    reader.read("num_experts_per_tok", spec.moe.router_topk);
    read_router_loss(reader, 0.001, spec.moe);
  }
  if (is_qwen_moe(type)) read_qwen_moe(reader, type, spec);
  reader.read("_name_or_path", spec.name);
  if (spec.name.empty()) spec.name = source;
  for (const IgnoredKey& ignored : kIgnoredKeys) reader.ignore(ignored.key);
  reader.reject_unknown_keys("megaplan does not read this key for model_type \"" + type +
                             "\" and cannot tell that it leaves the model unchanged, so it is refused rather than "
                             "ignored (core/hf_config.cc lists every key read or ignored, with its reason)");
  return spec;
}

ModelSpec load_model_spec(const std::string& name_or_path) {
  if (!name_or_path.ends_with(".json")) return model_preset(name_or_path);
  const nlohmann::json json = read_json_file(name_or_path);
  return is_hf_config(json) ? model_spec_from_hf_config(json, name_or_path) : model_spec_from_json(json, name_or_path);
}

}  // namespace megaplan
