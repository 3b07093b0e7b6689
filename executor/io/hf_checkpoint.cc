#include "executor/io/hf_checkpoint.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <sentencepiece_processor.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/hf_config.h"
#include "core/json_io.h"
#include "core/parallel_plan.h"
#include "core/parameter_list.h"
#include "core/text_file.h"
#include "executor/io/staged_file.h"

namespace megaplan::exec {

namespace {

std::string layer_prefix(int64_t layer) { return "decoder.layers." + std::to_string(layer) + "."; }

int64_t columns_of(const WholeTensor& tensor) { return tensor.shape.size() > 1 ? tensor.shape[1] : 1; }

// The rows `rows` of a row-major tensor, in that order.
WholeTensor take_rows(const WholeTensor& tensor, const std::vector<int64_t>& rows) {
  const int64_t columns = columns_of(tensor);
  WholeTensor part;
  part.shape = tensor.shape;
  part.shape[0] = static_cast<int64_t>(rows.size());
  part.values.reserve(rows.size() * static_cast<std::size_t>(columns));
  for (const int64_t row : rows) {
    const auto begin = tensor.values.begin() + static_cast<std::ptrdiff_t>(row * columns);
    part.values.insert(part.values.end(), begin, begin + columns);
  }
  return part;
}

// take_rows' inverse: `parts` stacked one after another, each stacked row r placed at row rows[r].
// REQUIRES: the parts hold rows.size() rows together.
WholeTensor place_rows(const std::vector<WholeTensor>& parts, const std::vector<int64_t>& rows) {
  WholeTensor whole;
  whole.shape = parts.front().shape;
  whole.shape[0] = static_cast<int64_t>(rows.size());
  const int64_t columns = columns_of(parts.front());
  whole.values.resize(rows.size() * static_cast<std::size_t>(columns));
  int64_t stacked = 0;
  for (const WholeTensor& part : parts) {
    for (int64_t r = 0; r < part.shape[0]; ++r, ++stacked) {
      std::copy_n(
          part.values.begin() + static_cast<std::ptrdiff_t>(r * columns), columns,
          whole.values.begin() + static_cast<std::ptrdiff_t>(rows[static_cast<std::size_t>(stacked)] * columns));
    }
  }
  return whole;
}

WholeTensor transpose(const WholeTensor& tensor) {
  const int64_t rows = tensor.shape[0], columns = tensor.shape[1];
  WholeTensor result{{columns, rows}, std::vector<float>(tensor.values.size())};
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < columns; ++c) {
      result.values[static_cast<std::size_t>(c * rows + r)] = tensor.values[static_cast<std::size_t>(r * columns + c)];
    }
  }
  return result;
}

// Megatron's fused QKV rows split by what they are: for each query group, its `group` query heads,
// its key and its value, `dim` rows each. Returns the Megatron rows of the queries (in Hugging
// Face's order: head by head), of the keys and of the values.
std::array<std::vector<int64_t>, 3> qkv_rows(int64_t groups, int64_t group, int64_t dim) {
  std::array<std::vector<int64_t>, 3> rows;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t slot = 0; slot < group + 2; ++slot) {
      std::vector<int64_t>& part = slot < group ? rows[0] : slot == group ? rows[1] : rows[2];
      for (int64_t e = 0; e < dim; ++e) part.push_back((g * (group + 2) + slot) * dim + e);
    }
  }
  return rows;
}

// One Megatron tensor and where it lives in the Hugging Face checkpoint: one tensor renamed (and
// transposed for GPT-2's Conv1D), or rows split over several.
struct Mapping {
  std::string megatron;
  std::vector<std::string> hf;             // one, or the parts in stacking order
  std::vector<std::vector<int64_t>> rows;  // per part: the Megatron rows it holds (empty: all, one part)
  bool transposed = false;
};

std::vector<Mapping> mappings(const ModelSpec& model, const std::string& type) {
  std::vector<Mapping> list;
  const bool gpt2 = type == "gpt2";
  const int64_t heads = model.num_attention_heads, groups = model.effective_num_query_groups();
  const int64_t dim = model.effective_kv_channels(), ffn = model.effective_ffn_hidden_size();
  const auto qkv = [&] {
    const auto split = qkv_rows(groups, heads / groups, dim);
    return std::vector<std::vector<int64_t>>(split.begin(), split.end());
  }();
  // A SwiGLU fc1 of `width` is [gate; up]: the rows of each half.
  const auto gate_up = [](int64_t width) {
    std::vector<std::vector<int64_t>> halves(2);
    for (int64_t i = 0; i < width; ++i) {
      halves[0].push_back(i);
      halves[1].push_back(width + i);
    }
    return halves;
  };
  // GPT-2's c_attn outputs are [queries | keys | values], each head by head: Megatron's rows in that order.
  std::vector<int64_t> c_attn;
  for (const auto& part : qkv) c_attn.insert(c_attn.end(), part.begin(), part.end());
  const auto add = [&](const std::string& megatron, const std::string& hf, bool transposed = false) {
    list.push_back({megatron, {hf}, {}, transposed});
  };
  if (gpt2) {
    add(kWordEmbeddings, "transformer.wte.weight");
    add("embedding.position_embeddings.weight", "transformer.wpe.weight");
  } else {
    add(kWordEmbeddings, "model.embed_tokens.weight");
  }
  for (int64_t l = 0; l < model.num_layers; ++l) {
    const std::string m = layer_prefix(l);
    if (gpt2) {
      const std::string h = "transformer.h." + std::to_string(l) + ".";
      for (const char* suffix : {"weight", "bias"}) {
        add(m + "input_layernorm." + suffix, h + "ln_1." + suffix);
        add(m + "pre_mlp_layernorm." + suffix, h + "ln_2." + suffix);
      }
      list.push_back({m + "self_attention.linear_qkv.weight", {h + "attn.c_attn.weight"}, {c_attn}, true});
      list.push_back({m + "self_attention.linear_qkv.bias", {h + "attn.c_attn.bias"}, {c_attn}, false});
      add(m + "self_attention.linear_proj.weight", h + "attn.c_proj.weight", true);
      add(m + "self_attention.linear_proj.bias", h + "attn.c_proj.bias");
      add(m + "mlp.linear_fc1.weight", h + "mlp.c_fc.weight", true);
      add(m + "mlp.linear_fc1.bias", h + "mlp.c_fc.bias");
      add(m + "mlp.linear_fc2.weight", h + "mlp.c_proj.weight", true);
      add(m + "mlp.linear_fc2.bias", h + "mlp.c_proj.bias");
      continue;
    }
    const std::string h = "model.layers." + std::to_string(l) + ".";
    add(m + "input_layernorm.weight", h + "input_layernorm.weight");
    add(m + "pre_mlp_layernorm.weight", h + "post_attention_layernorm.weight");
    if (model.qk_layernorm) {  // Qwen3's query and key norms
      add(m + "self_attention.q_layernorm.weight", h + "self_attn.q_norm.weight");
      add(m + "self_attention.k_layernorm.weight", h + "self_attn.k_norm.weight");
    }
    // A SwiGLU MLP of `width`: Megatron's fc1 [gate; up] and fc2 from HF's gate, up and down.
    const auto swiglu = [&](const std::string& megatron, const std::string& gate, const std::string& up,
                            const std::string& down, const std::string& suffix, int64_t width) {
      list.push_back({megatron + "linear_fc1." + suffix, {gate + suffix, up + suffix}, gate_up(width), false});
      add(megatron + "linear_fc2." + suffix, down + suffix);
    };
    for (const char* suffix : {"weight", "bias"}) {
      const std::string s = suffix;
      list.push_back({m + "self_attention.linear_qkv." + s,
                      {h + "self_attn.q_proj." + s, h + "self_attn.k_proj." + s, h + "self_attn.v_proj." + s},
                      qkv,
                      false});
      add(m + "self_attention.linear_proj." + s, h + "self_attn.o_proj." + s);
      if (!model.moe.moe_layer(l)) {
        swiglu(m + "mlp.", h + "mlp.gate_proj.", h + "mlp.up_proj.", h + "mlp.down_proj.", s, ffn);
      }
    }
    if (!model.moe.moe_layer(l)) continue;
    // Experts (no biases: hf_model_type refuses them): Mixtral's block_sparse_moe with w1 (gate), w3
    // (up) and w2 (down); Qwen2-MoE's and Qwen3-MoE's mlp.experts, and Qwen2-MoE's gated shared expert.
    const int64_t width = model.effective_moe_ffn_hidden_size();
    const bool mixtral = type == "mixtral";
    add(m + "mlp.router.weight", h + (mixtral ? "block_sparse_moe.gate.weight" : "mlp.gate.weight"));
    for (int64_t e = 0; e < model.moe.num_experts; ++e) {
      const std::string expert = m + "mlp.experts.local_experts." + std::to_string(e) + ".";
      if (mixtral) {
        const std::string w = h + "block_sparse_moe.experts." + std::to_string(e) + ".";
        swiglu(expert, w + "w1.", w + "w3.", w + "w2.", "weight", width);
      } else {
        const std::string w = h + "mlp.experts." + std::to_string(e) + ".";
        swiglu(expert, w + "gate_proj.", w + "up_proj.", w + "down_proj.", "weight", width);
      }
    }
    if (model.moe.shared_expert_intermediate_size > 0) {
      const std::string w = h + "mlp.shared_expert.";
      swiglu(m + "mlp.shared_experts.", w + "gate_proj.", w + "up_proj.", w + "down_proj.", "weight",
             model.moe.shared_expert_intermediate_size);
      add(m + "mlp.shared_experts.gate_weight", h + "mlp.shared_expert_gate.weight");
    }
  }
  if (gpt2) {
    add("decoder.final_layernorm.weight", "transformer.ln_f.weight");
    add("decoder.final_layernorm.bias", "transformer.ln_f.bias");
  } else {
    add("decoder.final_layernorm.weight", "model.norm.weight");
  }
  add(kOutputWeight, "lm_head.weight");
  return list;
}

// config.json of the architecture: the true vocabulary (hf_checkpoint.h says why).
nlohmann::json config_of_architecture(const ModelSpec& model, const std::string& type, SafetensorsDtype dtype) {
  const int64_t vocabulary = model.vocab_size;
  const std::string torch_dtype = dtype == SafetensorsDtype::kBF16 ? "bfloat16" : "float32";
  const bool tied = !model.untie_embeddings_and_output_weights;
  if (type == "gpt2") {
    return {{"architectures", {"GPT2LMHeadModel"}},
            {"model_type", "gpt2"},
            {"n_layer", model.num_layers},
            {"n_embd", model.hidden_size},
            {"n_head", model.num_attention_heads},
            {"n_inner", model.effective_ffn_hidden_size()},
            {"n_positions", model.effective_max_position_embeddings()},
            {"n_ctx", model.seq_length},
            {"vocab_size", vocabulary},
            {"layer_norm_epsilon", model.norm_epsilon},
            {"activation_function", "gelu_new"},
            // megaplan trains without dropout; GPT2Config's defaults are 0.1.
            {"attn_pdrop", 0.0},
            {"embd_pdrop", 0.0},
            {"resid_pdrop", 0.0},
            {"tie_word_embeddings", tied},
            {"torch_dtype", torch_dtype}};
  }
  const std::string architecture = type == "qwen2"       ? "Qwen2ForCausalLM"
                                   : type == "qwen2_moe" ? "Qwen2MoeForCausalLM"
                                   : type == "qwen3"     ? "Qwen3ForCausalLM"
                                   : type == "qwen3_moe" ? "Qwen3MoeForCausalLM"
                                   : type == "mixtral"   ? "MixtralForCausalLM"
                                   : type == "mistral"   ? "MistralForCausalLM"
                                                         : "LlamaForCausalLM";
  nlohmann::json config = {{"architectures", {architecture}},
                           {"model_type", type},
                           {"hidden_size", model.hidden_size},
                           {"intermediate_size", model.effective_ffn_hidden_size()},
                           {"num_hidden_layers", model.num_layers},
                           {"num_attention_heads", model.num_attention_heads},
                           {"num_key_value_heads", model.effective_num_query_groups()},
                           {"head_dim", model.effective_kv_channels()},
                           {"max_position_embeddings", model.effective_max_position_embeddings()},
                           {"vocab_size", vocabulary},
                           {"rms_norm_eps", model.norm_epsilon},
                           {"rope_theta", model.rotary_base},
                           {"hidden_act", "silu"},
                           {"tie_word_embeddings", tied},
                           {"torch_dtype", torch_dtype}};
  if (const RopeScaling& scaling = model.rope_scaling; scaling.enabled()) {
    config["rope_scaling"] = {{"rope_type", "llama3"},
                              {"factor", scaling.factor},
                              {"low_freq_factor", scaling.low_freq_factor},
                              {"high_freq_factor", scaling.high_freq_factor},
                              {"original_max_position_embeddings", scaling.original_max_position_embeddings}};
  }
  if (type == "llama") config["attention_bias"] = false;
  if (type == "mistral" || type == "mixtral") config["sliding_window"] = nullptr;
  const MoeSpec& moe = model.moe;
  if (moe.enabled()) {
    // The router's loss as transformers trains it: the switch loss's weight, under output_router_logits.
    config["num_experts_per_tok"] = moe.effective_router_topk();
    config["router_aux_loss_coef"] = moe.aux_loss_coeff;
    config["output_router_logits"] = moe.aux_loss_coeff > 0;
  }
  if (type == "mixtral") {
    config["num_local_experts"] = moe.num_experts;
    config["intermediate_size"] = model.effective_moe_ffn_hidden_size();  // each expert's
  }
  if (type == "qwen3" || type == "qwen3_moe") {
    config["attention_bias"] = false;
    config["use_sliding_window"] = false;
  }
  if (type == "qwen2_moe" || type == "qwen3_moe") {
    config["num_experts"] = moe.num_experts;
    config["moe_intermediate_size"] = model.effective_moe_ffn_hidden_size();
    if (type == "qwen2_moe") {
      config["shared_expert_intermediate_size"] = moe.shared_expert_intermediate_size;
      config["qkv_bias"] = model.add_qkv_bias;
    }
    config["norm_topk_prob"] = !moe.router_pre_softmax;
    config["use_sliding_window"] = false;
    // Every layer a sparse step; the dense ones listed.
    config["decoder_sparse_step"] = 1;
    nlohmann::json dense = nlohmann::json::array();
    for (int64_t layer = 0; layer < model.num_layers; ++layer) {
      if (!moe.moe_layer(layer)) dense.push_back(layer);
    }
    config["mlp_only_layers"] = dense;
  }
  return config;
}

// config.json: the architecture's, with the tokenizer's special ids where known.
nlohmann::json config_of(const ModelSpec& model, const std::string& type, SafetensorsDtype dtype,
                         const HfTokenizerExport& tokenizer) {
  nlohmann::json config = config_of_architecture(model, type, dtype);
  if (tokenizer.bos_token_id) config["bos_token_id"] = *tokenizer.bos_token_id;
  if (tokenizer.eos_token_id) config["eos_token_id"] = *tokenizer.eos_token_id;
  return config;
}

// The id of the special token `key` ("bos_token") that the tokenizer_config.json beside a
// tokenizer.json names (a string, or an object with its "content"), found among tokenizer.json's
// added tokens and vocabulary; nullopt where there is none or a file cannot be read.
std::optional<int64_t> hf_config_token_id(const std::string& tokenizer_file, const std::string& key) {
  const std::filesystem::path config_path =
      std::filesystem::path(tokenizer_file).parent_path() / "tokenizer_config.json";
  std::error_code error;
  if (!std::filesystem::is_regular_file(config_path, error)) return std::nullopt;
  try {
    const std::optional<nlohmann::json> config = try_parse_json(read_file_contents(config_path.string()));
    if (!config || !config->is_object() || !config->contains(key)) return std::nullopt;
    const nlohmann::json& token = config->at(key);
    const nlohmann::json* content = token.is_object() && token.contains("content") ? &token.at("content") : &token;
    if (!content->is_string()) return std::nullopt;
    const std::optional<nlohmann::json> tokenizer = try_parse_json(read_file_contents(tokenizer_file));
    if (!tokenizer || !tokenizer->is_object()) return std::nullopt;
    if (const auto added = tokenizer->find("added_tokens"); added != tokenizer->end() && added->is_array()) {
      for (const nlohmann::json& entry : *added) {
        if (entry.is_object() && entry.value("content", nlohmann::json()) == *content && entry.contains("id") &&
            entry.at("id").is_number_integer()) {
          return entry.at("id").get<int64_t>();
        }
      }
    }
    const auto model = tokenizer->find("model");
    if (model != tokenizer->end() && model->is_object() && model->contains("vocab") && model->at("vocab").is_object()) {
      const nlohmann::json& vocab = model->at("vocab");
      const auto found = vocab.find(content->get<std::string>());
      if (found != vocab.end() && found->is_number_integer()) return found->get<int64_t>();
    }
  } catch (const SpecError&) {
  }
  return std::nullopt;
}

}  // namespace

std::string hf_model_type(const ModelSpec& model, const std::string& requested) {
  const bool llama_like = model.normalization == Normalization::kRMSNorm && model.swiglu &&
                          model.position_embedding_type == PositionEmbedding::kRope && !model.add_bias_linear;
  const bool gpt_like = model.normalization == Normalization::kLayerNorm && !model.swiglu &&
                        model.position_embedding_type == PositionEmbedding::kLearnedAbsolute && model.add_bias_linear &&
                        model.effective_num_query_groups() == model.num_attention_heads &&
                        model.effective_kv_channels() * model.num_attention_heads == model.hidden_size;
  const MoeSpec& moe = model.moe;
  const bool qk_norm = model.qk_layernorm;
  const std::string dense_default = gpt_like ? "gpt2" : qk_norm ? "qwen3" : model.add_qkv_bias ? "qwen2" : "llama";
  const bool mixtral_like =
      moe.shared_expert_intermediate_size == 0 && moe.moe_layers(0, model.num_layers) == model.num_layers;
  const std::string moe_default = qk_norm                                                          ? "qwen3_moe"
                                  : mixtral_like && !moe.router_pre_softmax && !model.add_qkv_bias ? "mixtral"
                                                                                                   : "qwen2_moe";
  const std::string type = !requested.empty() ? requested : moe.enabled() ? moe_default : dense_default;
  const auto refuse = [&](const std::string& why) { throw SpecError("--model-type", type + " " + why); };
  const bool moe_type = type == "mixtral" || type == "qwen2_moe" || type == "qwen3_moe";
  const bool qwen3 = type == "qwen3" || type == "qwen3_moe";
  if (type != "gpt2" && !moe_type && type != "llama" && type != "mistral" && type != "qwen2" && type != "qwen3") {
    throw SpecError(
        "--model-type",
        "must be llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe or gpt2, got \"" + type + "\"");
  }
  if (qk_norm != qwen3) {
    refuse(qwen3 ? "normalises each query and key head; this model does not (--qk-layernorm)"
                 : "has no query and key norms; this model has them (--qk-layernorm): qwen3 or qwen3_moe");
  }
  if (moe.enabled() != moe_type) {
    refuse(moe_type ? "has experts; this model has none (--num-experts)"
                    : "has no experts; this model has " + std::to_string(moe.num_experts) +
                          " (mixtral, qwen2_moe or qwen3_moe)");
  }
  if (type == "gpt2") {
    if (!gpt_like) refuse("is GPT-2's architecture: LayerNorm, GELU, learned positions, biases, one group per head");
    return type;
  }
  // The Llama family, with experts or without.
  if (!llama_like) refuse("needs RMSNorm, SwiGLU, RoPE and no linear biases");
  if (!moe_type && (type == "qwen2") != model.add_qkv_bias) {
    refuse(type == "qwen2" ? "has QKV biases (--add-qkv-bias)" : "has no QKV biases alone; qwen2 has them");
  }
  if (type == "qwen3_moe" && model.add_qkv_bias) refuse("has no QKV biases; qwen2_moe has them");
  if (model.rotary_percent != 1.0) refuse("rotates every dimension of a head (--rotary-percent 1)");
  if (!moe_type) return type;
  // transformers' two routers: the softmax over every expert, top k, renormalised over the k (Mixtral;
  // Qwen2-MoE under norm_topk_prob) or not (Qwen2-MoE); no drop, no bias, no scaling.
  if (moe.score_function != RouterScoreFunction::kSoftmax || moe.router_enable_expert_bias) {
    refuse("routes by the softmax of the router's logits (no sigmoid scores, no expert bias)");
  }
  if (moe.router_topk_scaling_factor) refuse("scales no probabilities (--moe-router-topk-scaling-factor)");
  if (moe.expert_capacity_factor) refuse("drops no token (--moe-expert-capacity-factor)");
  if (moe.load_balancing == LoadBalancing::kSeqAuxLoss) refuse("trains the switch loss, not seq_aux_loss");
  if (moe.z_loss_coeff > 0) refuse("has no z loss (--moe-z-loss-coeff)");
  if (type == "mixtral") {
    if (!mixtral_like) refuse("has experts in every layer and no shared expert");
    if (moe.router_pre_softmax) refuse("renormalises the top k's probabilities (no --moe-router-pre-softmax)");
    if (model.add_qkv_bias) refuse("has no QKV biases; qwen2_moe has them");
  } else if (type == "qwen3_moe" && moe.shared_expert_intermediate_size > 0) {
    refuse("has no shared expert (--moe-shared-expert-intermediate-size); qwen2_moe has one");
  } else if (moe.shared_expert_intermediate_size > 0 && !moe.shared_expert_gate) {
    refuse("gates its shared expert (--moe-shared-expert-gate)");
  }
  return type;
}

int64_t write_hf_checkpoint(const std::string& directory, const ModelSpec& model, const std::string& type,
                            const std::map<std::string, WholeTensor>& tensors, SafetensorsDtype dtype,
                            const HfTokenizerExport& tokenizer, uint64_t shard_bytes) {
  // Hugging Face's tensors, each from its Megatron tensor.
  std::map<std::string, WholeTensor> hf;
  for (const Mapping& mapping : mappings(model, type)) {
    const auto found = tensors.find(mapping.megatron);
    if (found == tensors.end()) continue;  // a bias the model has not, a tied output layer's copy
    if (mapping.megatron == kOutputWeight && !model.untie_embeddings_and_output_weights) continue;
    const WholeTensor* megatron = &found->second;
    WholeTensor unpadded;
    if (mapping.megatron == kWordEmbeddings || mapping.megatron == kOutputWeight) {
      // The true vocabulary's rows: the padding is the layout's, not the model's.
      if (megatron->shape.size() != 2 || megatron->shape[0] < model.vocab_size) {
        throw SpecError("--save", mapping.megatron + " has shape " + nlohmann::json(megatron->shape).dump() +
                                      ", fewer rows than the vocabulary of " + std::to_string(model.vocab_size));
      }
      unpadded.shape = {model.vocab_size, megatron->shape[1]};
      unpadded.values.assign(
          megatron->values.begin(),
          megatron->values.begin() + static_cast<std::ptrdiff_t>(model.vocab_size * megatron->shape[1]));
      megatron = &unpadded;
    }
    for (std::size_t p = 0; p < mapping.hf.size(); ++p) {
      WholeTensor part = mapping.rows.empty() ? *megatron : take_rows(*megatron, mapping.rows[p]);
      hf[mapping.hf[p]] = mapping.transposed ? transpose(part) : std::move(part);
    }
  }
  const auto written = static_cast<int64_t>(hf.size());
  // Shards of at most shard_bytes, in name order (a larger tensor is a shard of its own).
  std::vector<std::map<std::string, WholeTensor>> shards(1);
  uint64_t bytes = 0, total = 0;
  for (auto& [name, tensor] : hf) {
    const uint64_t size = safetensors_bytes(tensor, dtype);
    if (bytes > 0 && bytes + size > shard_bytes) {
      shards.emplace_back();
      bytes = 0;
    }
    bytes += size;
    total += size;
    shards.back().emplace(name, std::move(tensor));
  }
  namespace fs = std::filesystem;
  std::error_code error;
  fs::create_directories(directory, error);
  if (error) throw SpecError("--save", directory + ": cannot create: " + error.message());
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  nlohmann::json weight_map = nlohmann::json::object();
  for (std::size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    const std::string file = shards.size() == 1 ? "model.safetensors" : name;
    write_safetensors(directory + "/" + file, shards[s], dtype, metadata, "--save");
    for (const auto& [tensor, value] : shards[s]) weight_map[tensor] = file;
  }
  if (shards.size() > 1) {
    const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_file_atomically(directory + "/model.safetensors.index.json", index.dump(2) + "\n");
  }
  for (const auto& [source, name] : tokenizer.files) {
    write_file_atomically(directory + "/" + name, read_file_contents(source));
  }
  write_file_atomically(directory + "/config.json", config_of(model, type, dtype, tokenizer).dump(2) + "\n");
  return written;
}

HfTokenizerExport hf_tokenizer_export(const std::optional<TokenizerOptions>& tokenizer, int64_t vocab_size) {
  HfTokenizerExport result;
  if (!tokenizer) {
    result.note =
        "tokenizer: unknown (the checkpoint records none: its run named no tokenizer, or it was saved before "
        "megaplan recorded it): config.json has no bos_token_id or eos_token_id, no tokenizer files copied";
    return result;
  }
  const TokenizerOptions& options = *tokenizer;
  const std::string main_file = tokenizer_main_file(options);
  const std::string described = "tokenizer: " + options.kind + (main_file.empty() ? "" : " (" + main_file + ")");
  std::unique_ptr<Tokenizer> reader;
  try {
    reader = make_tokenizer(options);
  } catch (const SpecError& error) {
    result.note = described + " cannot be read now (" + printable_line(error.what()) +
                  "): config.json has no bos_token_id or eos_token_id, no tokenizer files copied";
    return result;
  }
  std::vector<std::string> missing;  // what is left out, for the note
  try {
    result.eos_token_id = reader->end_of_document();
  } catch (const SpecError&) {
    missing.push_back("it has no end-of-text token");
  }
  const auto beside = [&](const std::string& file, const char* name) {
    const std::string path = (std::filesystem::path(file).parent_path() / name).string();
    if (std::filesystem::is_regular_file(path)) result.files.emplace_back(path, name);
  };
  if (options.kind == "gpt2") {
    result.bos_token_id = result.eos_token_id;  // GPT-2's <|endoftext|> is both, as transformers' gpt2 says
    result.files = {{options.vocab_file, "vocab.json"}, {options.merge_file, "merges.txt"}};
  } else if (options.kind == "hf") {
    result.bos_token_id = hf_config_token_id(options.tokenizer_file, "bos_token");
    result.files = {{options.tokenizer_file, "tokenizer.json"}};
    beside(options.tokenizer_file, "tokenizer_config.json");
    beside(options.tokenizer_file, "special_tokens_map.json");
  } else if (options.kind == "sentencepiece") {
    sentencepiece::SentencePieceProcessor processor;
    if (processor.Load(options.tokenizer_model).ok() && processor.bos_id() >= 0)
      result.bos_token_id = processor.bos_id();
    result.files = {{options.tokenizer_model, "tokenizer.model"}};
    beside(options.tokenizer_model, "tokenizer_config.json");
    beside(options.tokenizer_model, "special_tokens_map.json");
  } else {
    missing.push_back("transformers has no byte tokenizer to copy");
  }
  if (!result.bos_token_id) missing.push_back("it names no beginning-of-text token");
  for (std::optional<int64_t>* id : {&result.bos_token_id, &result.eos_token_id}) {
    if (*id && (**id < 0 || **id >= vocab_size)) {
      missing.push_back("its id " + std::to_string(**id) + " lies outside the vocabulary of " +
                        std::to_string(vocab_size));
      id->reset();
    }
  }
  std::string copied;
  for (const auto& [source, name] : result.files) copied += (copied.empty() ? "" : ", ") + name;
  result.note = described + ": " + (copied.empty() ? "no files copied" : "copied " + copied);
  if (result.bos_token_id) result.note += "; bos_token_id " + std::to_string(*result.bos_token_id);
  if (result.eos_token_id) result.note += "; eos_token_id " + std::to_string(*result.eos_token_id);
  for (const std::string& why : missing) result.note += "; " + why;
  return result;
}

HfCheckpoint read_hf_checkpoint(const std::string& directory) {
  const std::string config_path = directory + "/config.json";
  if (!std::filesystem::exists(config_path)) throw SpecError("--load", directory + " holds no config.json");
  const nlohmann::json config = read_json_file(config_path);
  HfCheckpoint checkpoint;
  checkpoint.model = model_spec_from_hf_config(config, config_path);
  validate_model_spec(checkpoint.model);
  const std::string written_as = hf_model_type(checkpoint.model, config.value("model_type", std::string("")));

  // Which file holds each tensor: the index's weight map, or the one file.
  std::map<std::string, std::string> file_of;
  const std::string index_path = directory + "/model.safetensors.index.json";
  if (std::filesystem::exists(index_path)) {
    const nlohmann::json index = read_json_file(index_path);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      throw SpecError("--load", index_path + ": no \"weight_map\" object");
    }
    for (const auto& [name, file] : index["weight_map"].items()) {
      if (!file.is_string()) throw SpecError("--load", index_path + ": weight_map." + name + " is not a file name");
      file_of[name] = directory + "/" + file.get<std::string>();
    }
  }
  std::map<std::string, SafetensorsHeader> headers;
  const auto header_of = [&](const std::string& name) -> const SafetensorsHeader* {
    const auto mapped = file_of.find(name);
    const std::string path = mapped != file_of.end() ? mapped->second : directory + "/model.safetensors";
    auto found = headers.find(path);
    if (found == headers.end()) found = headers.emplace(path, read_safetensors_header(path, "--load")).first;
    return found->second.tensors.count(name) ? &found->second : nullptr;
  };
  // A weight that is not finite would train as NaN from the first step: refused naming the tensor.
  const auto read = [&](const std::string& name) -> std::optional<WholeTensor> {
    const SafetensorsHeader* header = header_of(name);
    if (!header) return std::nullopt;
    WholeTensor tensor = read_safetensors_tensor(*header, name, "--load");
    const auto bad =
        std::find_if(tensor.values.begin(), tensor.values.end(), [](float v) { return !std::isfinite(v); });
    if (bad != tensor.values.end()) {
      throw SpecError("--load", header->path + ": tensor " + name + " holds " +
                                    (std::isnan(*bad) ? "NaN"
                                     : *bad > 0       ? "+inf"
                                                      : "-inf") +
                                    " at element " + std::to_string(bad - tensor.values.begin()) +
                                    ": weights must be finite");
    }
    return tensor;
  };

  std::map<std::string, Mapping> by_megatron;
  for (Mapping& mapping : mappings(checkpoint.model, written_as))
    by_megatron.emplace(mapping.megatron, std::move(mapping));
  // Megatron's tensors of the whole model on one rank, with their global shapes.
  for (const ParameterSpec& spec : describe_parameters(checkpoint.model, ParallelPlan{}, 0)) {
    const bool tied_copy = spec.name == kOutputWeight && !checkpoint.model.untie_embeddings_and_output_weights;
    if (tied_copy) continue;
    const Mapping& mapping = by_megatron.at(spec.name);
    std::vector<WholeTensor> parts;
    for (const std::string& name : mapping.hf) {
      std::optional<WholeTensor> part = read(name);
      if (!part) throw SpecError("--load", directory + " holds no tensor " + name + ", which " + written_as + " needs");
      parts.push_back(mapping.transposed && part->shape.size() == 2 ? transpose(*part) : std::move(*part));
    }
    WholeTensor whole;
    if (mapping.rows.empty()) {
      whole = std::move(parts.front());
    } else {
      std::vector<int64_t> rows;
      int64_t stacked = 0;
      for (std::size_t p = 0; p < parts.size(); ++p) {
        rows.insert(rows.end(), mapping.rows[p].begin(), mapping.rows[p].end());
        stacked += parts[p].shape.empty() ? 0 : parts[p].shape[0];
      }
      if (stacked != static_cast<int64_t>(rows.size())) {
        throw SpecError("--load", directory + ": " + mapping.hf.front() + " and the tensors it is joined with hold " +
                                      std::to_string(stacked) + " rows, " + spec.name + " needs " +
                                      std::to_string(rows.size()));
      }
      whole = place_rows(parts, rows);
    }
    // The vocabulary's tensors hold config.json's vocab_size rows (megaplan pads them for its layout
    // when it writes a checkpoint).
    std::vector<int64_t> expected = spec.global_shape;
    if (spec.name == kWordEmbeddings || spec.name == kOutputWeight) expected[0] = checkpoint.model.vocab_size;
    if (whole.shape != expected) {
      throw SpecError("--load", directory + ": " + mapping.hf.front() + " gives " + spec.name + " the shape " +
                                    nlohmann::json(whole.shape).dump() + ", config.json's is " +
                                    nlohmann::json(expected).dump());
    }
    checkpoint.tensors.emplace(spec.name, std::move(whole));
  }
  return checkpoint;
}

}  // namespace megaplan::exec
