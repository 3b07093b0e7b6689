// ModelSpec validation, vocabulary padding and JSON mapping.
#include "core/model_spec.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "core/checked_math.h"
#include "core/input_limits.h"
#include "core/json_io.h"
#include "core/moe_spec.h"

namespace megaplan {

std::string to_string(Normalization normalization) {
  return normalization == Normalization::kLayerNorm ? "LayerNorm" : "RMSNorm";
}

std::string to_string(PositionEmbedding position_embedding) {
  return position_embedding == PositionEmbedding::kLearnedAbsolute ? "learned_absolute" : "rope";
}

Normalization parse_normalization(const std::string& text, const std::string& field) {
  if (text == "LayerNorm") return Normalization::kLayerNorm;
  if (text == "RMSNorm") return Normalization::kRMSNorm;
  throw SpecError(field, "must be LayerNorm or RMSNorm, got \"" + text + "\"");
}

PositionEmbedding parse_position_embedding(const std::string& text, const std::string& field) {
  if (text == "learned_absolute") return PositionEmbedding::kLearnedAbsolute;
  if (text == "rope") return PositionEmbedding::kRope;
  throw SpecError(field, "must be learned_absolute or rope, got \"" + text + "\"");
}

int64_t padded_vocab_size(const ModelSpec& spec, int64_t tensor_parallel_size) {
  const int64_t multiple =
      checked_multiply(spec.make_vocab_size_divisible_by, tensor_parallel_size, "--make-vocab-size-divisible-by");
  return round_up_to_multiple(spec.vocab_size, multiple, "--vocab-size");
}

void require_rope_scaling_factor(double factor, const std::string& field) {
  if (!(factor >= 1) || !std::isfinite(factor)) {
    throw SpecError(field, "must be a finite number >= 1, got " + nlohmann::json(factor).dump());
  }
}

void validate_model_spec(const ModelSpec& spec) {
  require_positive(spec.num_layers, "--num-layers");
  require_positive(spec.hidden_size, "--hidden-size");
  require_positive(spec.num_attention_heads, "--num-attention-heads");
  require_positive(spec.seq_length, "--seq-length");
  require_positive(spec.vocab_size, "--vocab-size");
  require_positive(spec.make_vocab_size_divisible_by, "--make-vocab-size-divisible-by");
  require_at_most(spec.num_layers, kMaxLayers, "--num-layers");
  require_at_most(spec.hidden_size, kMaxHiddenSize, "--hidden-size");
  require_at_most(spec.num_attention_heads, kMaxHeads, "--num-attention-heads");
  require_at_most(spec.seq_length, kMaxSequenceLength, "--seq-length");
  require_at_most(spec.vocab_size, kMaxVocabulary, "--vocab-size");
  require_at_most(spec.make_vocab_size_divisible_by, kMaxVocabulary, "--make-vocab-size-divisible-by");
  require_at_most(spec.ffn_hidden_size, kMaxHiddenSize, "--ffn-hidden-size");
  require_at_most(spec.kv_channels, kMaxHiddenSize, "--kv-channels");
  require_at_most(spec.num_query_groups, kMaxHeads, "--num-query-groups");
  require_at_most(spec.max_position_embeddings, kMaxSequenceLength, "--max-position-embeddings");
  // Zero in these means "Megatron's default"; negative is never meaningful.
  const std::pair<int64_t, const char*> defaulted[] = {{spec.ffn_hidden_size, "--ffn-hidden-size"},
                                                       {spec.num_query_groups, "--num-query-groups"},
                                                       {spec.kv_channels, "--kv-channels"},
                                                       {spec.max_position_embeddings, "--max-position-embeddings"}};
  for (const auto& [value, field] : defaulted) {
    if (value < 0) throw SpecError(field, "must be a positive integer, got " + std::to_string(value));
  }
  if (spec.kv_channels == 0 && spec.hidden_size % spec.num_attention_heads != 0) {
    throw SpecError("--hidden-size", "must be divisible by --num-attention-heads (" + std::to_string(spec.hidden_size) +
                                         " % " + std::to_string(spec.num_attention_heads) +
                                         " != 0) unless --kv-channels is given");
  }
  const int64_t groups = spec.effective_num_query_groups();
  if (groups > spec.num_attention_heads || spec.num_attention_heads % groups != 0) {
    throw SpecError("--num-query-groups", "must divide --num-attention-heads (" +
                                              std::to_string(spec.num_attention_heads) + " heads, " +
                                              std::to_string(groups) + " groups)");
  }
  if (spec.effective_max_position_embeddings() < spec.seq_length) {
    throw SpecError("--seq-length", "must not exceed --max-position-embeddings (" + std::to_string(spec.seq_length) +
                                        " > " + std::to_string(spec.effective_max_position_embeddings()) + ")");
  }
  if (!(spec.norm_epsilon > 0) || !(spec.norm_epsilon < 1)) {
    throw SpecError("--norm-epsilon", "must be in (0, 1), got " + nlohmann::json(spec.norm_epsilon).dump());
  }
  if (!(spec.rotary_base > 1) || !std::isfinite(spec.rotary_base)) {
    throw SpecError("--rotary-base", "must be a finite number above 1, got " + nlohmann::json(spec.rotary_base).dump());
  }
  if (!(spec.rotary_percent > 0) || !(spec.rotary_percent <= 1)) {
    throw SpecError("--rotary-percent", "must be in (0, 1], got " + nlohmann::json(spec.rotary_percent).dump());
  }
  if (const RopeScaling& scaling = spec.rope_scaling; scaling.enabled()) {
    if (spec.position_embedding_type != PositionEmbedding::kRope) {
      throw SpecError("--use-rope-scaling", "needs --position-embedding-type rope");
    }
    require_rope_scaling_factor(scaling.factor, "--rope-scaling-factor");
    if (!(scaling.low_freq_factor > 0) || !(scaling.high_freq_factor > scaling.low_freq_factor) ||
        !std::isfinite(scaling.high_freq_factor)) {
      throw SpecError("rope_scaling", "needs 0 < low_freq_factor < high_freq_factor, finite; got " +
                                          nlohmann::json(scaling.low_freq_factor).dump() + " and " +
                                          nlohmann::json(scaling.high_freq_factor).dump());
    }
    if (scaling.original_max_position_embeddings <= 0) {
      throw SpecError("rope_scaling", "original_max_position_embeddings must be positive, got " +
                                          std::to_string(scaling.original_max_position_embeddings));
    }
  }
  if (spec.position_embedding_type == PositionEmbedding::kRope &&
      (spec.rotary_dim() < 2 || spec.rotary_dim() % 2 != 0)) {
    throw SpecError("--rotary-percent", "must leave an even number of rotated dimensions, at least 2: --kv-channels " +
                                            std::to_string(spec.effective_kv_channels()) + " x " +
                                            nlohmann::json(spec.rotary_percent).dump() + " gives " +
                                            std::to_string(spec.rotary_dim()));
  }
  if (spec.qk_layernorm && spec.normalization != Normalization::kRMSNorm) {
    throw SpecError("--qk-layernorm",
                    "is modelled with --normalization RMSNorm only (Qwen3's query and key norms), not with LayerNorm");
  }
  if (spec.effective_ffn_hidden_size() <= 0) {
    throw SpecError("--ffn-hidden-size",
                    "the SwiGLU default (2/3 of 4h rounded down to 64) is 0 for "
                    "--hidden-size " +
                        std::to_string(spec.hidden_size) + "; give --ffn-hidden-size");
  }
  validate_moe_spec(spec.moe, spec.num_layers);
  // Every count derived later (per-layer weights, embeddings, totals) must fit in 64 bits.
  const int64_t query_width = checked_multiply(spec.effective_kv_channels(), spec.num_attention_heads, "--kv-channels");
  const int64_t kv_width = checked_multiply(spec.effective_kv_channels(),
                                            checked_multiply(groups, 2, "--num-query-groups"), "--kv-channels");
  const int64_t widest =
      std::max({spec.hidden_size, checked_multiply(spec.effective_ffn_hidden_size(), 2, "--ffn-hidden-size"),
                checked_add(query_width, kv_width, "--kv-channels")});
  const int64_t layer_weights =
      checked_multiply(checked_multiply(spec.hidden_size, widest, "--hidden-size"), 4, "--hidden-size");
  checked_multiply(layer_weights, spec.num_layers, "--num-layers");
  if (spec.moe.enabled()) {
    const int64_t expert_weights = checked_multiply(
        checked_multiply(spec.hidden_size, spec.effective_moe_ffn_hidden_size(), "--moe-ffn-hidden-size"), 3,
        "--moe-ffn-hidden-size");
    checked_multiply(checked_multiply(expert_weights, spec.moe.num_experts, "--num-experts"), spec.num_layers,
                     "--num-experts");
    const int64_t shared_weights =
        checked_multiply(checked_multiply(spec.hidden_size, spec.moe.shared_expert_intermediate_size,
                                          "--moe-shared-expert-intermediate-size"),
                         3, "--moe-shared-expert-intermediate-size");
    checked_multiply(shared_weights, spec.num_layers, "--moe-shared-expert-intermediate-size");
  }
  const int64_t vocab = round_up_to_multiple(spec.vocab_size, spec.make_vocab_size_divisible_by, "--vocab-size");
  checked_multiply(checked_multiply(vocab, spec.hidden_size, "--vocab-size"), 2, "--vocab-size");
  checked_multiply(spec.effective_max_position_embeddings(), spec.hidden_size, "--max-position-embeddings");
}

nlohmann::json model_spec_to_json(const ModelSpec& spec) {
  nlohmann::json json{
      {"name", spec.name},
      {"num_layers", spec.num_layers},
      {"hidden_size", spec.hidden_size},
      {"ffn_hidden_size", spec.effective_ffn_hidden_size()},
      {"num_attention_heads", spec.num_attention_heads},
      {"num_query_groups", spec.effective_num_query_groups()},
      {"kv_channels", spec.effective_kv_channels()},
      {"seq_length", spec.seq_length},
      {"max_position_embeddings", spec.effective_max_position_embeddings()},
      {"vocab_size", spec.vocab_size},
      {"make_vocab_size_divisible_by", spec.make_vocab_size_divisible_by},
      {"swiglu", spec.swiglu},
      {"normalization", to_string(spec.normalization)},
      {"position_embedding_type", to_string(spec.position_embedding_type)},
      {"untie_embeddings_and_output_weights", spec.untie_embeddings_and_output_weights},
      {"add_bias_linear", spec.add_bias_linear},
      {"add_qkv_bias", spec.add_qkv_bias},
      {"qk_layernorm", spec.qk_layernorm},
      {"norm_epsilon", spec.norm_epsilon},
      {"rotary_base", spec.rotary_base},
      {"rotary_percent", spec.rotary_percent},
  };
  if (spec.moe.enabled()) {
    write_moe_spec(spec.moe, json);
    json["moe_ffn_hidden_size"] = spec.effective_moe_ffn_hidden_size();
  }
  if (spec.rope_scaling.enabled()) {
    json["rope_scaling"] = {{"factor", spec.rope_scaling.factor},
                            {"low_freq_factor", spec.rope_scaling.low_freq_factor},
                            {"high_freq_factor", spec.rope_scaling.high_freq_factor},
                            {"original_max_position_embeddings", spec.rope_scaling.original_max_position_embeddings}};
  }
  return json;
}

ModelSpec model_spec_from_json(const nlohmann::json& json, const std::string& source) {
  JsonFieldReader reader(json, source);
  ModelSpec spec;
  spec.name = source;
  reader.read("name", spec.name);
  reader.require("num_layers", spec.num_layers);
  reader.require("hidden_size", spec.hidden_size);
  // Each of these given must be a count or a width: 0 in a file is no "unset" (leave the key out).
  const auto read_positive = [&](const std::string& key, int64_t& out) {
    if (reader.read(key, out) && out < 1) {
      throw SpecError(reader.field(key), "must be a positive integer, got " + std::to_string(out) +
                                             " (leave the key out for the default)");
    }
  };
  read_positive("ffn_hidden_size", spec.ffn_hidden_size);
  reader.require("num_attention_heads", spec.num_attention_heads);
  read_positive("num_query_groups", spec.num_query_groups);
  read_positive("kv_channels", spec.kv_channels);
  reader.require("seq_length", spec.seq_length);
  read_positive("max_position_embeddings", spec.max_position_embeddings);
  reader.require("vocab_size", spec.vocab_size);
  reader.read("make_vocab_size_divisible_by", spec.make_vocab_size_divisible_by);
  reader.read("swiglu", spec.swiglu);
  std::string text;
  if (reader.read("normalization", text)) spec.normalization = parse_normalization(text, reader.field("normalization"));
  if (reader.read("position_embedding_type", text)) {
    spec.position_embedding_type = parse_position_embedding(text, reader.field("position_embedding_type"));
  }
  reader.read("untie_embeddings_and_output_weights", spec.untie_embeddings_and_output_weights);
  reader.read("add_bias_linear", spec.add_bias_linear);
  reader.read("add_qkv_bias", spec.add_qkv_bias);
  reader.read("qk_layernorm", spec.qk_layernorm);
  reader.read("norm_epsilon", spec.norm_epsilon);
  reader.read("rotary_base", spec.rotary_base);
  reader.read("rotary_percent", spec.rotary_percent);
  read_moe_spec(json, reader, spec.moe);
  if (const nlohmann::json* scaling = reader.read_object("rope_scaling")) {
    JsonFieldReader scaling_reader(*scaling, source + ": rope_scaling");
    scaling_reader.require("factor", spec.rope_scaling.factor);
    require_rope_scaling_factor(spec.rope_scaling.factor, scaling_reader.field("factor"));
    scaling_reader.read("low_freq_factor", spec.rope_scaling.low_freq_factor);
    scaling_reader.read("high_freq_factor", spec.rope_scaling.high_freq_factor);
    scaling_reader.read("original_max_position_embeddings", spec.rope_scaling.original_max_position_embeddings);
    scaling_reader.reject_unknown_keys();
  }
  reader.reject_unknown_keys();
  return spec;
}

}  // namespace megaplan
