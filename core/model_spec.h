// ModelSpec: a decoder-only transformer described with Megatron-LM's argument names, so a
// Megatron command line, a megaplan JSON file and a Hugging Face config.json all map onto it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "core/error.h"
#include "core/moe_spec.h"

namespace megaplan {

enum class Normalization { kLayerNorm, kRMSNorm };
enum class PositionEmbedding { kLearnedAbsolute, kRope };

// Megatron's spellings: "LayerNorm", "RMSNorm"; "learned_absolute", "rope".
std::string to_string(Normalization normalization);
std::string to_string(PositionEmbedding position_embedding);
// Throw SpecError(field, ...) listing the accepted spellings.
Normalization parse_normalization(const std::string& text, const std::string& field);
PositionEmbedding parse_position_embedding(const std::string& text, const std::string& field);

// Llama 3.1's RoPE scaling (Megatron's --use-rope-scaling and --rope-scaling-factor; a Hugging
// Face config's rope_scaling of rope_type "llama3"): frequencies of wavelengths above
// original_max_position_embeddings / low_freq_factor are divided by `factor`, those below
// original_max_position_embeddings / high_freq_factor kept, those between blended
// (executor/kernels/rope_frequency.h). factor 0: no scaling. Megatron's and Meta's values.
struct RopeScaling {
  double factor = 0;
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  int64_t original_max_position_embeddings = 8192;
  bool enabled() const { return factor > 0; }
};

struct ModelSpec {
  std::string name;  // preset name, file name, or "custom"

  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t ffn_hidden_size = 0;  // 0 means Megatron's default (see effective_ffn_hidden_size)
  int64_t num_attention_heads = 0;
  int64_t num_query_groups = 0;  // 0 means multi-head attention: one group per head
  int64_t kv_channels = 0;       // head dimension; 0 means hidden_size / num_attention_heads
  int64_t seq_length = 0;
  int64_t max_position_embeddings = 0;  // 0 means seq_length
  int64_t vocab_size = 0;               // unpadded tokenizer vocabulary
  int64_t make_vocab_size_divisible_by = 128;

  bool swiglu = false;
  Normalization normalization = Normalization::kLayerNorm;
  PositionEmbedding position_embedding_type = PositionEmbedding::kLearnedAbsolute;
  bool untie_embeddings_and_output_weights = false;
  bool add_bias_linear = true;  // Megatron's default; --disable-bias-linear turns it off
  bool add_qkv_bias = false;    // QKV bias even when linear biases are off (Qwen2)
  bool qk_layernorm = false;    // --qk-layernorm: each query and key head normalised before RoPE (Qwen3)
  double norm_epsilon = 1e-5;   // --norm-epsilon: the norms' epsilon (Megatron's default)
  double rotary_base = 10000;   // --rotary-base: RoPE's theta (Llama 3: 500000)
  double rotary_percent = 1.0;  // --rotary-percent: the share of each head's dimensions that rotate
  RopeScaling rope_scaling;     // --use-rope-scaling, --rope-scaling-factor
  MoeSpec moe;                  // --num-experts and its companions (core/moe_spec.h)

  // Effective values with Megatron's defaults applied.
  // Megatron's default: 4h, or with SwiGLU 2/3 of that rounded down to a multiple of 64 so the
  // two input projections keep the parameter count of a 4h MLP.
  int64_t effective_ffn_hidden_size() const {
    if (ffn_hidden_size > 0) return ffn_hidden_size;
    return swiglu ? (4 * hidden_size * 2 / 3) / 64 * 64 : 4 * hidden_size;
  }
  // Each expert's width: --moe-ffn-hidden-size, else the model's.
  int64_t effective_moe_ffn_hidden_size() const {
    return moe.ffn_hidden_size > 0 ? moe.ffn_hidden_size : effective_ffn_hidden_size();
  }
  int64_t effective_num_query_groups() const { return num_query_groups > 0 ? num_query_groups : num_attention_heads; }
  int64_t effective_kv_channels() const { return kv_channels > 0 ? kv_channels : hidden_size / num_attention_heads; }
  int64_t effective_max_position_embeddings() const {
    return max_position_embeddings > 0 ? max_position_embeddings : seq_length;
  }
  int64_t query_projection_size() const { return effective_kv_channels() * num_attention_heads; }
  int64_t kv_projection_size() const { return effective_kv_channels() * effective_num_query_groups(); }
  // Megatron's rotary_dim: int(kv_channels * rotary_percent), the rotated dimensions of a head.
  int64_t rotary_dim() const {
    return static_cast<int64_t>(static_cast<double>(effective_kv_channels()) * rotary_percent);
  }
};

// Megatron's _vocab_size_with_padding: round vocab_size up to a multiple of
// make_vocab_size_divisible_by * tensor_parallel_size.
// REQUIRES: validate_model_spec(spec) passed; tensor_parallel_size > 0.
int64_t padded_vocab_size(const ModelSpec& spec, int64_t tensor_parallel_size);

// Throws SpecError naming the field (as its Megatron flag, e.g. "--hidden-size") and the rule.
// Llama 3.1's RoPE scaling factor: a finite number >= 1. Checked where a factor is read, since a
// factor of 0 is how RopeScaling says "none": 0 or less given must not read as no scaling.
void require_rope_scaling_factor(double factor, const std::string& field);
void validate_model_spec(const ModelSpec& spec);

// JSON uses Megatron's argument names with underscores ("num_layers", "hidden_size", ...).
// Reading is strict: unknown keys and wrong types are SpecErrors naming the key.
nlohmann::json model_spec_to_json(const ModelSpec& spec);
ModelSpec model_spec_from_json(const nlohmann::json& json, const std::string& source);

}  // namespace megaplan
