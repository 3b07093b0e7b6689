// The preset table. Architecture numbers come from the papers and model cards cited beside each.
#include "core/model_presets.h"

#include <algorithm>
#include <cctype>
#include <optional>

#include "core/edit_distance.h"
#include "core/error.h"

namespace megaplan {

namespace {

ModelSpec gpt(const std::string& name, int64_t layers, int64_t hidden, int64_t heads, int64_t seq, int64_t vocab) {
  ModelSpec spec;
  spec.name = name;
  spec.num_layers = layers;
  spec.hidden_size = hidden;
  spec.num_attention_heads = heads;
  spec.seq_length = seq;
  spec.max_position_embeddings = seq;
  spec.vocab_size = vocab;
  return spec;  // LayerNorm, GELU MLP of 4h, learned positions, tied embeddings, biases
}

// Llama 2's and 3's configs: RMSNorm epsilon 1e-5 and RoPE theta 10000 (Llama 2) or 500000 (Llama 3).
ModelSpec llama(const std::string& name, int64_t layers, int64_t hidden, int64_t ffn, int64_t heads,
                int64_t query_groups, int64_t seq, int64_t max_positions, int64_t vocab, double rotary_base) {
  ModelSpec spec;
  spec.name = name;
  spec.num_layers = layers;
  spec.hidden_size = hidden;
  spec.ffn_hidden_size = ffn;
  spec.num_attention_heads = heads;
  spec.num_query_groups = query_groups;
  spec.seq_length = seq;
  spec.max_position_embeddings = max_positions;
  spec.vocab_size = vocab;
  spec.swiglu = true;
  spec.normalization = Normalization::kRMSNorm;
  spec.position_embedding_type = PositionEmbedding::kRope;
  spec.untie_embeddings_and_output_weights = true;
  spec.add_bias_linear = false;
  spec.norm_epsilon = 1e-5;
  spec.rotary_base = rotary_base;
  return spec;
}

// Mixtral's configs: a Mistral decoder (Llama's, RoPE theta 1e6) whose every MLP is `experts`
// SwiGLU experts of the MLP's width, each token routed to its top 2.
ModelSpec mixtral(const std::string& name, int64_t layers, int64_t hidden, int64_t ffn, int64_t heads,
                  int64_t query_groups, int64_t positions, int64_t vocab, int64_t experts) {
  ModelSpec spec = llama(name, layers, hidden, ffn, heads, query_groups, positions, positions, vocab, 1e6);
  spec.moe.num_experts = experts;
  spec.moe.router_topk = 2;
  return spec;
}

// Qwen3's configs: a Llama decoder (RMSNorm epsilon 1e-6, RoPE theta 1e6, untied) with heads of
// 128 whatever the width, each query and key head normalised (q_norm, k_norm). Pre-trained at 4096
// tokens; positions to 40960 (the configs').
ModelSpec qwen3(const std::string& name, int64_t layers, int64_t hidden, int64_t ffn, int64_t heads,
                int64_t query_groups) {
  ModelSpec spec = llama(name, layers, hidden, ffn, heads, query_groups, 4096, 40960, 151936, 1e6);
  spec.kv_channels = 128;
  spec.norm_epsilon = 1e-6;
  spec.qk_layernorm = true;
  return spec;
}

// Qwen3-MoE's configs: Qwen3's decoder with 4 query groups and in every layer 128 SwiGLU experts of
// `expert_ffn`, each token routed to its top 8 renormalised (norm_topk_prob). `ffn`, the configs'
// intermediate_size, is a dense MLP's width, which no layer has.
ModelSpec qwen3_moe(const std::string& name, int64_t layers, int64_t hidden, int64_t ffn, int64_t heads,
                    int64_t expert_ffn) {
  ModelSpec spec = qwen3(name, layers, hidden, ffn, heads, 4);
  spec.moe.num_experts = 128;
  spec.moe.router_topk = 8;
  spec.moe.ffn_hidden_size = expert_ffn;
  return spec;
}

constexpr int64_t kGpt2Vocab = 50257;

std::vector<ModelPreset> build_model_presets() {
  const std::string gpt2_card = "Radford et al. 2019 (GPT-2); size as counted for Hugging Face ";
  return {
      {gpt("gpt2-124m", 12, 768, 12, 1024, kGpt2Vocab), 124e6, gpt2_card + "gpt2"},
      {gpt("gpt2-350m", 24, 1024, 16, 1024, kGpt2Vocab), 355e6, gpt2_card + "gpt2-medium"},
      {gpt("gpt2-774m", 36, 1280, 20, 1024, kGpt2Vocab), 774e6, gpt2_card + "gpt2-large"},
      {gpt("gpt2-1.5b", 48, 1600, 25, 1024, kGpt2Vocab), 1558e6, gpt2_card + "gpt2-xl"},
      // GPT-3 XL's shape (Brown et al. 2020, Table 2.1) with 16 heads of 128, as commonly trained.
      {gpt("gpt-1.3b", 24, 2048, 16, 2048, kGpt2Vocab), 1.3e9, "Brown et al. 2020, Table 2.1 (GPT-3 XL)"},
      {gpt("gpt3-175b", 96, 12288, 96, 2048, kGpt2Vocab), 175e9, "Brown et al. 2020, Table 2.1 (GPT-3)"},
      {gpt("gpt-1t", 128, 25600, 160, 2048, 51200), 1008e9,
       "Narayanan et al. 2021 (PTD-P), Table 1: 1008B, vocabulary 51,200"},
      {llama("llama2-7b", 32, 4096, 11008, 32, 32, 4096, 4096, 32000, 10000), 6.74e9,
       "Touvron et al. 2023 (Llama 2); 6.74B counted for meta-llama/Llama-2-7b-hf"},
      {llama("llama3-8b", 32, 4096, 14336, 32, 8, 8192, 8192, 128256, 500000), 8.03e9,
       "Meta Llama 3 model card (8B; 8.03B counted for Meta-Llama-3-8B)"},
      {llama("llama3-70b", 80, 8192, 28672, 64, 8, 8192, 8192, 128256, 500000), 70.6e9,
       "Meta Llama 3 model card (70B; 70.6B counted for Meta-Llama-3-70B)"},
      // Pre-trained at 8K context; positions extend to 128K with RoPE scaling.
      {llama("llama3.1-405b", 126, 16384, 53248, 128, 8, 8192, 131072, 128256, 500000), 405e9,
       "Dubey et al. 2024 (The Llama 3 Herd of Models), Table 3"},
      // Mixtures of experts (issue 40): trained, simulated and searched at tp and cp 1.
      {mixtral("mixtral-8x7b", 32, 4096, 14336, 32, 8, 32768, 32000, 8), 46.7e9,
       "Jiang et al. 2024 (Mixtral of Experts): 46.7B, 12.9B active; mistralai/Mixtral-8x7B-v0.1's config"},
      {mixtral("mixtral-8x22b", 56, 6144, 16384, 48, 8, 65536, 32768, 8), 141e9,
       "Mistral AI, Mixtral 8x22B (2024): 141B, 39B active; mistralai/Mixtral-8x22B-v0.1's config"},
      {qwen3("qwen3-8b", 36, 4096, 12288, 32, 8), 8.2e9,
       "Qwen3 technical report (2025), Table 1: 8.2B; Qwen/Qwen3-8B's config"},
      {qwen3("qwen3-32b", 64, 5120, 25600, 64, 8), 32.8e9,
       "Qwen3 technical report (2025), Table 1: 32.8B; Qwen/Qwen3-32B's config"},
      {qwen3_moe("qwen3-30b-a3b", 48, 2048, 6144, 32, 768), 30.5e9,
       "Qwen3 technical report (2025), Table 2: 30.5B, 3.3B active; Qwen/Qwen3-30B-A3B's config"},
      {qwen3_moe("qwen3-235b-a22b", 94, 4096, 12288, 64, 1536), 235e9,
       "Qwen3 technical report (2025), Table 2: 235B, 22B active; Qwen/Qwen3-235B-A22B's config"},
  };
}

}  // namespace

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = build_model_presets();
  return presets;
}

std::optional<std::string> nearest_model_preset(const std::string& name) {
  // Over lowercase letters: "GPT3-175B" is gpt3-175b.
  const auto lower = [](std::string text) {
    for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return text;
  };
  const std::string typed = lower(name);
  // A quarter of the name's characters (at least one) may be wrong: "gpt3-17b" is a typo of
  // gpt3-175b, "gpt5" is no typo of gpt-1t (two edits in four characters).
  const std::size_t allowed = std::max<std::size_t>(1, typed.size() / 4);
  std::optional<std::string> nearest;
  std::size_t best = allowed + 1;
  for (const ModelPreset& preset : model_presets()) {
    const std::size_t edits = edit_distance(typed, lower(preset.spec.name));
    if (edits < best) {
      best = edits;
      nearest = preset.spec.name;
    }
  }
  return nearest;
}

ModelSpec model_preset(const std::string& name) {
  std::string known;
  for (const ModelPreset& preset : model_presets()) {
    if (preset.spec.name == name) return preset.spec;
    known += (known.empty() ? "" : ", ") + preset.spec.name;
  }
  const std::optional<std::string> nearest = nearest_model_preset(name);
  throw SpecError("--model", "unknown preset \"" + name + "\"; " + (nearest ? "did you mean " + *nearest + "? " : "") +
                                 "known presets: " + known + " (or a .json file)");
}

}  // namespace megaplan
