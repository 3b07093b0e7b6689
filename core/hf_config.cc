// Hugging Face config.json import. Field names follow transformers' LlamaConfig, MistralConfig,
// Qwen2Config and GPT2Config; defaults are those classes' defaults where the file omits a field.
#include "core/hf_config.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_io.h"
#include "core/model_presets.h"

namespace megaplan {

namespace {

// Lenient reader: HF configs hold many fields we do not model, so unknown keys are fine, but the
// ones we read must have the right type.
int64_t integer_field(const nlohmann::json& json, const std::string& key, const std::string& source) {
  const auto found = json.find(key);
  if (found == json.end() || found->is_null()) throw SpecError(source + ": " + key, "required field is missing");
  if (!found->is_number_integer()) throw SpecError(source + ": " + key, "must be an integer, got " + found->dump());
  return found->get<int64_t>();
}

int64_t optional_integer_field(const nlohmann::json& json, const std::string& key, int64_t fallback,
                               const std::string& source) {
  const auto found = json.find(key);
  if (found == json.end() || found->is_null()) return fallback;
  return integer_field(json, key, source);
}

bool optional_bool_field(const nlohmann::json& json, const std::string& key, bool fallback, const std::string& source) {
  const auto found = json.find(key);
  if (found == json.end() || found->is_null()) return fallback;
  if (!found->is_boolean()) throw SpecError(source + ": " + key, "must be true or false, got " + found->dump());
  return found->get<bool>();
}

std::string optional_string_field(const nlohmann::json& json, const std::string& key, const std::string& fallback,
                                  const std::string& source) {
  const auto found = json.find(key);
  if (found == json.end() || found->is_null()) return fallback;
  if (!found->is_string()) throw SpecError(source + ": " + key, "must be a string, got " + found->dump());
  return found->get<std::string>();
}

std::string model_type_of(const nlohmann::json& json, const std::string& source) {
  std::string type = optional_string_field(json, "model_type", "", source);
  if (!type.empty()) return type;
  if (json.contains("n_layer") && json.contains("n_embd")) return "gpt2";
  if (json.contains("num_hidden_layers")) return "llama";
  return "";
}

ModelSpec from_llama_family(const nlohmann::json& json, const std::string& type, const std::string& source) {
  const std::string activation = optional_string_field(json, "hidden_act", "silu", source);
  if (activation != "silu") {
    throw SpecError(source + ": hidden_act", "only \"silu\" (SwiGLU) is supported for " + type + ", got \"" +
                                                 activation + "\"");
  }
  ModelSpec spec;
  spec.num_layers = integer_field(json, "num_hidden_layers", source);
  spec.hidden_size = integer_field(json, "hidden_size", source);
  spec.ffn_hidden_size = integer_field(json, "intermediate_size", source);
  spec.num_attention_heads = integer_field(json, "num_attention_heads", source);
  spec.num_query_groups = optional_integer_field(json, "num_key_value_heads", spec.num_attention_heads, source);
  spec.kv_channels = optional_integer_field(json, "head_dim", 0, source);
  spec.max_position_embeddings = integer_field(json, "max_position_embeddings", source);
  spec.seq_length = spec.max_position_embeddings;
  spec.vocab_size = integer_field(json, "vocab_size", source);
  spec.swiglu = true;
  spec.normalization = Normalization::kRMSNorm;
  spec.position_embedding_type = PositionEmbedding::kRope;
  spec.untie_embeddings_and_output_weights = !optional_bool_field(json, "tie_word_embeddings", false, source);
  spec.add_bias_linear = false;
  // Qwen2 always has QKV biases; Llama's attention_bias puts biases on q, k, v (and o).
  spec.add_qkv_bias = type == "qwen2" || optional_bool_field(json, "attention_bias", false, source);
  return spec;
}

ModelSpec from_gpt2(const nlohmann::json& json, const std::string& source) {
  ModelSpec spec;
  spec.num_layers = integer_field(json, "n_layer", source);
  spec.hidden_size = integer_field(json, "n_embd", source);
  spec.ffn_hidden_size = optional_integer_field(json, "n_inner", 0, source);
  spec.num_attention_heads = integer_field(json, "n_head", source);
  spec.max_position_embeddings = optional_integer_field(json, "n_positions", 1024, source);
  spec.seq_length = optional_integer_field(json, "n_ctx", spec.max_position_embeddings, source);
  spec.vocab_size = optional_integer_field(json, "vocab_size", 50257, source);
  spec.untie_embeddings_and_output_weights = !optional_bool_field(json, "tie_word_embeddings", true, source);
  return spec;  // LayerNorm, GELU, learned positions, biases: Megatron's GPT defaults
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

bool is_hf_config(const nlohmann::json& json) {
  return json.is_object() && (json.contains("model_type") || json.contains("architectures") ||
                              json.contains("num_hidden_layers") || json.contains("n_layer"));
}

ModelSpec model_spec_from_hf_config(const nlohmann::json& json, const std::string& source) {
  if (!json.is_object()) throw SpecError(source, "must be a JSON object");
  const std::string type = model_type_of(json, source);
  ModelSpec spec;
  if (type == "llama" || type == "mistral" || type == "qwen2") {
    spec = from_llama_family(json, type, source);
  } else if (type == "gpt2") {
    spec = from_gpt2(json, source);
  } else {
    throw SpecError(source + ": model_type", "unsupported \"" + type + "\"; supported: llama, mistral, qwen2, gpt2");
  }
  spec.name = optional_string_field(json, "_name_or_path", source, source);
  return spec;
}

ModelSpec load_model_spec(const std::string& name_or_path) {
  if (!ends_with(name_or_path, ".json")) return model_preset(name_or_path);
  const nlohmann::json json = read_json_file(name_or_path);
  return is_hf_config(json) ? model_spec_from_hf_config(json, name_or_path)
                            : model_spec_from_json(json, name_or_path);
}

}  // namespace megaplan
