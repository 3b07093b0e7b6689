// Hugging Face config.json import: Llama, GPT-2 and Qwen2 field names, and bad files.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/formulas.h"
#include "core/hf_config.h"
#include "core/json_io.h"
#include "core/model_presets.h"
#include "core/model_spec.h"

using Catch::Matchers::Contains;

namespace {
const std::string kExamples = MEGAPLAN_EXAMPLES_DIR;
}

TEST_CASE("a Llama 3 config.json imports as the llama3-8b preset", "[hf_config]") {
  const megaplan::ModelSpec spec = megaplan::load_model_spec(kExamples + "/hf/llama3-8b-config.json");
  const megaplan::ModelSpec preset = megaplan::model_preset("llama3-8b");
  CHECK(spec.num_layers == 32);
  CHECK(spec.hidden_size == 4096);
  CHECK(spec.effective_ffn_hidden_size() == 14336);
  CHECK(spec.num_attention_heads == 32);
  CHECK(spec.effective_num_query_groups() == 8);
  CHECK(spec.vocab_size == 128256);
  CHECK(spec.max_position_embeddings == 8192);
  CHECK(spec.seq_length == 8192);
  CHECK(spec.swiglu);
  CHECK(spec.normalization == megaplan::Normalization::kRMSNorm);
  CHECK(spec.position_embedding_type == megaplan::PositionEmbedding::kRope);
  CHECK(spec.untie_embeddings_and_output_weights);
  CHECK_FALSE(spec.add_bias_linear);
  CHECK_FALSE(spec.add_qkv_bias);
  CHECK(megaplan::total_parameters(spec) == megaplan::total_parameters(preset));
}

TEST_CASE("a GPT-2 config.json imports with GPT-2's defaults", "[hf_config]") {
  const megaplan::ModelSpec spec = megaplan::load_model_spec(kExamples + "/hf/gpt2-config.json");
  CHECK(spec.num_layers == 12);
  CHECK(spec.hidden_size == 768);
  CHECK(spec.effective_ffn_hidden_size() == 3072);
  CHECK(spec.seq_length == 1024);
  CHECK_FALSE(spec.untie_embeddings_and_output_weights);
  CHECK(spec.normalization == megaplan::Normalization::kLayerNorm);
  CHECK(megaplan::total_parameters(spec) == megaplan::total_parameters(megaplan::model_preset("gpt2-124m")));
}

TEST_CASE("Qwen2 and Mistral use the Llama field names; Qwen2 has QKV biases", "[hf_config]") {
  nlohmann::json qwen = {{"model_type", "qwen2"},
                         {"num_hidden_layers", 24},
                         {"hidden_size", 896},
                         {"intermediate_size", 4864},
                         {"num_attention_heads", 14},
                         {"num_key_value_heads", 2},
                         {"max_position_embeddings", 32768},
                         {"vocab_size", 151936},
                         {"tie_word_embeddings", true},
                         {"hidden_act", "silu"}};
  const megaplan::ModelSpec spec = megaplan::model_spec_from_hf_config(qwen, "qwen.json");
  CHECK(spec.add_qkv_bias);
  CHECK_FALSE(spec.untie_embeddings_and_output_weights);
  CHECK(spec.effective_kv_channels() == 64);
  // Qwen2-0.5B: 494,032,768 parameters as published on its model card ("0.49B").
  CHECK(megaplan::total_parameters(spec) == 494'032'768);

  nlohmann::json mistral = qwen;
  mistral["model_type"] = "mistral";
  mistral["head_dim"] = 128;
  const megaplan::ModelSpec mistral_spec = megaplan::model_spec_from_hf_config(mistral, "m.json");
  CHECK(mistral_spec.effective_kv_channels() == 128);
  CHECK_FALSE(mistral_spec.add_qkv_bias);
}

TEST_CASE("unsupported or broken HF configs name the field", "[hf_config]") {
  const nlohmann::json bert = {{"model_type", "bert"}, {"num_hidden_layers", 12}};
  CHECK_THROWS_WITH(
      megaplan::model_spec_from_hf_config(bert, "c.json"),
      "c.json: model_type: unsupported \"bert\"; supported: llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, "
      "qwen3_moe, gpt2");
  const nlohmann::json missing = {{"model_type", "llama"}, {"num_hidden_layers", 12}};
  CHECK_THROWS_WITH(megaplan::model_spec_from_hf_config(missing, "c.json"),
                    "c.json: hidden_size: required field is missing");
  nlohmann::json gelu = {{"model_type", "llama"}, {"hidden_act", "gelu"}};
  CHECK_THROWS_WITH(megaplan::model_spec_from_hf_config(gelu, "c.json"), Contains("c.json: hidden_act: only \"silu\""));
  CHECK(megaplan::is_hf_config(nlohmann::json{{"n_layer", 2}}));
  CHECK_FALSE(megaplan::is_hf_config(nlohmann::json{{"num_layers", 2}}));
}

TEST_CASE("Mixtral-8x7B's config.json imports as the mixtral-8x7b preset", "[hf_config]") {
  const megaplan::ModelSpec spec = megaplan::load_model_spec(kExamples + "/hf/mixtral-8x7b-config.json");
  const megaplan::ModelSpec preset = megaplan::model_preset("mixtral-8x7b");
  CHECK(spec.moe.num_experts == 8);
  CHECK(spec.moe.effective_router_topk() == 2);
  CHECK(spec.effective_moe_ffn_hidden_size() == 14336);
  CHECK(spec.rotary_base == 1e6);
  CHECK(megaplan::total_parameters(spec) == megaplan::total_parameters(preset));
  CHECK(megaplan::active_parameters(spec) == megaplan::active_parameters(preset));
}

TEST_CASE("Qwen1.5-MoE-A2.7B's config.json imports with its shared expert, gate and router", "[hf_config]") {
  const megaplan::ModelSpec spec = megaplan::load_model_spec(kExamples + "/hf/qwen1.5-moe-a2.7b-config.json");
  CHECK(spec.moe.num_experts == 60);
  CHECK(spec.moe.effective_router_topk() == 4);
  CHECK(spec.effective_moe_ffn_hidden_size() == 1408);
  CHECK(spec.moe.shared_expert_intermediate_size == 5632);
  CHECK(spec.moe.shared_expert_gate);
  CHECK(spec.moe.router_pre_softmax);       // norm_topk_prob false: the top k of the softmax over 60
  CHECK(spec.moe.aux_loss_coeff == 0);      // output_router_logits false: transformers adds no loss
  CHECK(spec.moe.moe_layers(0, 24) == 24);  // decoder_sparse_step 1
  CHECK(spec.add_qkv_bias);
  // Counted from the config by hand: a layer's attention 2048 x 6144 + 6144 (QKV biases) + 2048^2,
  // 60 experts and the shared expert at 3 x 2048 x width, the gate 2048, the router 60 x 2048, two
  // norms; embeddings untied, 151,936 x 2048 each. The model card's "14.3B total, 2.7B activated";
  // transformers 5.17's Qwen2MoeForCausalLM of this config counts 14,315,784,192 too, and
  // 7,566,573,568 of the sparse variant below (on the device, 2026-11-29).
  const int64_t attention = 2048 * 6144 + 6144 + 2048 * 2048;
  const int64_t expert = 3 * 2048 * 1408;
  const int64_t layer = attention + 60 * expert + 3 * 2048 * 5632 + 2048 + 60 * 2048 + 2 * 2048;
  CHECK(megaplan::total_parameters(spec) == 24 * layer + 2 * 151936 * 2048 + 2048);
  CHECK(megaplan::total_parameters(spec) == 14'315'784'192);
  CHECK(megaplan::active_parameters(spec) == 14'315'784'192 - 24 * 56 * expert);
  CHECK(megaplan::active_parameters(spec) == 2'689'173'504);

  // decoder_sparse_step 2: layers 1, 3, ... hold experts; mlp_only_layers makes more dense; a
  // layer past the model, or a step of 0, is refused.
  nlohmann::json config = megaplan::read_json_file(kExamples + "/hf/qwen1.5-moe-a2.7b-config.json");
  config["decoder_sparse_step"] = 2;
  config["mlp_only_layers"] = {3};
  config["norm_topk_prob"] = true;
  config["output_router_logits"] = true;
  const megaplan::ModelSpec sparse = megaplan::model_spec_from_hf_config(config, "q.json");
  CHECK(sparse.moe.moe_layers(0, 24) == 11);
  CHECK_FALSE(sparse.moe.moe_layer(0));
  CHECK(sparse.moe.moe_layer(1));
  CHECK_FALSE(sparse.moe.moe_layer(3));
  CHECK_FALSE(sparse.moe.router_pre_softmax);
  CHECK(sparse.moe.aux_loss_coeff == 0.001);
  const int64_t moe_mlp = layer - attention - 2 * 2048, dense_mlp = 3 * 2048 * 5632;
  CHECK(megaplan::total_parameters(sparse) == 14'315'784'192 - 13 * moe_mlp + 13 * dense_mlp);
  config["mlp_only_layers"] = {24};
  CHECK_THROWS_WITH(megaplan::model_spec_from_hf_config(config, "q.json"),
                    "q.json: mlp_only_layers: names layer 24 of 24");
  config["mlp_only_layers"] = nlohmann::json::array();
  config["decoder_sparse_step"] = 0;
  CHECK_THROWS_WITH(megaplan::model_spec_from_hf_config(config, "q.json"),
                    "q.json: decoder_sparse_step: must be at least 1, got 0");
}

TEST_CASE("Qwen3-30B-A3B's config.json imports as the qwen3-30b-a3b preset, its query and key norms on",
          "[hf_config]") {
  const megaplan::ModelSpec spec = megaplan::load_model_spec(kExamples + "/hf/qwen3-30b-a3b-config.json");
  const megaplan::ModelSpec preset = megaplan::model_preset("qwen3-30b-a3b");
  CHECK(spec.qk_layernorm);
  CHECK_FALSE(spec.add_qkv_bias);
  CHECK(spec.effective_kv_channels() == 128);  // 32 heads of 128 over a stream of 2048
  CHECK(spec.effective_num_query_groups() == 4);
  CHECK(spec.moe.num_experts == 128);
  CHECK(spec.moe.effective_router_topk() == 8);
  CHECK(spec.effective_moe_ffn_hidden_size() == 768);
  CHECK(spec.moe.shared_expert_intermediate_size == 0);
  CHECK_FALSE(spec.moe.router_pre_softmax);  // norm_topk_prob: renormalised over the 8
  CHECK(spec.moe.moe_layers(0, 48) == 48);
  CHECK(spec.norm_epsilon == 1e-6);
  CHECK(spec.rotary_base == 1e6);
  CHECK(megaplan::total_parameters(spec) == megaplan::total_parameters(preset));
  CHECK(megaplan::active_parameters(spec) == megaplan::active_parameters(preset));
  // transformers 5 saves num_experts under its other name, num_local_experts: read as Qwen's, not
  // Mixtral's; the two names disagreeing are refused.
  nlohmann::json saved = megaplan::read_json_file(kExamples + "/hf/qwen3-30b-a3b-config.json");
  saved.erase("num_experts");
  saved["num_local_experts"] = 128;
  CHECK(megaplan::total_parameters(megaplan::model_spec_from_hf_config(saved, "q.json")) ==
        megaplan::total_parameters(preset));
  saved["num_experts"] = 64;
  CHECK_THROWS_WITH(megaplan::model_spec_from_hf_config(saved, "q.json"),
                    "q.json: num_local_experts: 128 disagrees with num_experts 64, its other name");
  // Qwen3's dense models: the same norms, and Qwen3Config's head_dim of 128 where the file omits it.
  nlohmann::json dense = megaplan::read_json_file(kExamples + "/hf/qwen3-30b-a3b-config.json");
  for (const char* key :
       {"num_experts", "num_experts_per_tok", "moe_intermediate_size", "head_dim", "decoder_sparse_step",
        "mlp_only_layers", "norm_topk_prob", "output_router_logits", "router_aux_loss_coef"}) {
    dense.erase(key);
  }
  dense["model_type"] = "qwen3";
  dense["architectures"] = {"Qwen3ForCausalLM"};
  const megaplan::ModelSpec qwen3 = megaplan::model_spec_from_hf_config(dense, "q.json");
  CHECK(qwen3.qk_layernorm);
  CHECK_FALSE(qwen3.moe.enabled());
  CHECK(qwen3.effective_kv_channels() == 128);
  CHECK(qwen3.effective_ffn_hidden_size() == 6144);
}

TEST_CASE("keys of an architecture megaplan does not model are refused whatever model_type says", "[hf_config]") {
  const nlohmann::json dense = {{"num_hidden_layers", 2},   {"hidden_size", 64},
                                {"intermediate_size", 128}, {"num_attention_heads", 4},
                                {"num_key_value_heads", 2}, {"max_position_embeddings", 32768},
                                {"vocab_size", 512},        {"hidden_act", "silu"}};
  const auto with = [&](const nlohmann::json& extra) {
    nlohmann::json config = dense;
    config.update(extra);
    return config;
  };
  // Mixtral's experts, by its model_type or by its keys under another name (or none): never a dense
  // Llama. Qwen's experts (Qwen2/3-MoE) are not modelled yet.
  for (const nlohmann::json& extra : {nlohmann::json{{"model_type", "mistral"}, {"num_local_experts", 4}},
                                      nlohmann::json{{"num_local_experts", 4}, {"num_experts_per_tok", 1}},
                                      nlohmann::json{{"model_type", "mixtral"}}}) {
    INFO(extra.dump());
    const megaplan::ModelSpec spec = megaplan::model_spec_from_hf_config(with(extra), "c.json");
    CHECK(spec.moe.num_experts == (extra.contains("num_local_experts") ? 4 : 8));  // MixtralConfig's default 8
    CHECK(spec.moe.effective_router_topk() == (extra.contains("num_experts_per_tok") ? 1 : 2));
    CHECK(spec.effective_moe_ffn_hidden_size() == 128);  // intermediate_size: each expert's
  }
  CHECK_THROWS_WITH(megaplan::model_spec_from_hf_config(with({{"num_experts_per_tok", 2}}), "c.json"),
                    Contains("c.json: num_experts_per_tok: mixture of experts is read for Mixtral"));
  // Qwen's experts without model_type: Qwen2-MoE and Qwen3-MoE (query and key norms) cannot be told apart.
  CHECK_THROWS_WITH(
      megaplan::model_spec_from_hf_config(with({{"num_experts", 128}, {"moe_intermediate_size", 768}}), "c.json"),
      Contains("c.json: num_experts: Qwen's mixture of experts is read under model_type \"qwen2_moe\" or "
               "\"qwen3_moe\" only"));
  // Qwen3-MoE has no shared expert: the key is refused under its name.
  CHECK_THROWS_WITH(megaplan::model_spec_from_hf_config(
                        with({{"model_type", "qwen3_moe"}, {"shared_expert_intermediate_size", 512}}), "c.json"),
                    Contains("c.json: shared_expert_intermediate_size: a shared expert is read for qwen2_moe only"));
  CHECK_THROWS_WITH(
      megaplan::model_spec_from_hf_config(with({{"model_type", "mixtral"}, {"router_jitter_noise", 0.01}}), "c.json"),
      Contains("c.json: router_jitter_noise: router input jitter is not modelled"));
  CHECK_THROWS_WITH(
      megaplan::model_spec_from_hf_config(with({{"model_type", "llama"}, {"kv_lora_rank", 512}}), "c.json"),
      Contains("c.json: kv_lora_rank: multi-head latent attention (DeepSeek's MLA) is not modelled"));
  CHECK_THROWS_WITH(megaplan::model_spec_from_hf_config(with({{"model_type", "llama"}, {"mlp_bias", true}}), "c.json"),
                    Contains("c.json: mlp_bias: biases on the MLP's projections"));
  // Mistral v0.1's window of 4096 of a 32768 context; null, as long as the context, or Qwen2's
  // window with use_sliding_window off are whole-sequence attention.
  CHECK_THROWS_WITH(
      megaplan::model_spec_from_hf_config(with({{"model_type", "mistral"}, {"sliding_window", 4096}}), "c.json"),
      Contains("c.json: sliding_window: sliding-window attention is not modelled"));
  for (const nlohmann::json& extra :
       {nlohmann::json{{"model_type", "mistral"}, {"sliding_window", nullptr}},
        nlohmann::json{{"model_type", "mistral"}, {"sliding_window", 32768}},
        nlohmann::json{{"model_type", "qwen2"}, {"sliding_window", 4096}, {"use_sliding_window", false}},
        nlohmann::json{{"model_type", "llama"}, {"mlp_bias", false}, {"num_experts", 0}}}) {
    INFO(extra.dump());
    CHECK(megaplan::model_spec_from_hf_config(with(extra), "c.json").num_layers == 2);
  }
  CHECK_THROWS_WITH(
      megaplan::model_spec_from_hf_config(
          with({{"model_type", "qwen2"}, {"sliding_window", 4096}, {"use_sliding_window", true}}), "c.json"),
      Contains("c.json: sliding_window"));
  // Zero is no "unset" (issue 42): a config's 0 heads or width is refused, not read as the default.
  for (const char* key : {"num_key_value_heads", "head_dim", "intermediate_size"}) {
    INFO(key);
    CHECK_THROWS_WITH(megaplan::model_spec_from_hf_config(with({{"model_type", "llama"}, {key, 0}}), "c.json"),
                      "c.json: " + std::string(key) + ": must be a positive integer, got 0");
  }
}

TEST_CASE("Llama 3.1's rope_scaling imports; other kinds are refused naming the field", "[hf_config]") {
  nlohmann::json config = nlohmann::json::parse(R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
    "vocab_size": 512, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
    "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}})");
  megaplan::ModelSpec spec = megaplan::model_spec_from_hf_config(config, "c.json");
  CHECK(spec.rope_scaling.factor == 8.0);
  CHECK(spec.rope_scaling.low_freq_factor == 1.0);
  CHECK(spec.rope_scaling.high_freq_factor == 4.0);
  CHECK(spec.rope_scaling.original_max_position_embeddings == 64);
  // A megaplan model file carries it too.
  const megaplan::ModelSpec again = megaplan::model_spec_from_json(megaplan::model_spec_to_json(spec), "m.json");
  CHECK(again.rope_scaling.factor == 8.0);
  CHECK(again.rope_scaling.original_max_position_embeddings == 64);
  CHECK_FALSE(megaplan::model_spec_to_json(megaplan::model_preset("llama3-8b")).contains("rope_scaling"));
  config["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  CHECK_THROWS_WITH(
      megaplan::model_spec_from_hf_config(config, "c.json"),
      Contains("c.json: rope_scaling: rope_type: only \"llama3\" (Llama 3.1's scaling) is modelled, got \"yarn\""));
  config["rope_scaling"] = nullptr;  // null: none
  CHECK_FALSE(megaplan::model_spec_from_hf_config(config, "c.json").rope_scaling.enabled());
  // transformers 5 writes rope_parameters, theta inside.
  config.erase("rope_theta");
  config["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 250000.0}};
  const megaplan::ModelSpec plain = megaplan::model_spec_from_hf_config(config, "c.json");
  CHECK(plain.rotary_base == 250000.0);
  CHECK_FALSE(plain.rope_scaling.enabled());
  config["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 500000.0},
                               {"factor", 32.0},          {"low_freq_factor", 1.0},
                               {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  CHECK(megaplan::model_spec_from_hf_config(config, "c.json").rope_scaling.factor == 32.0);
  // A factor of 0 or less is no "none" (issue 42): refused where it is read, as 0.5 is; and a
  // scaling that names no kind is refused, not read as none.
  for (const double factor : {0.0, -8.0}) {
    config["rope_parameters"]["factor"] = factor;
    CHECK_THROWS_WITH(megaplan::model_spec_from_hf_config(config, "c.json"),
                      Contains("c.json: rope_parameters: factor: must be a finite number >= 1"));
    nlohmann::json file = megaplan::model_spec_to_json(spec);
    file["rope_scaling"]["factor"] = factor;
    CHECK_THROWS_WITH(megaplan::model_spec_from_json(file, "m.json"),
                      Contains("m.json: rope_scaling: factor: must be a finite number >= 1"));
  }
  config["rope_parameters"] = {{"factor", 8.0}};
  CHECK_THROWS_WITH(megaplan::model_spec_from_hf_config(config, "c.json"),
                    Contains("c.json: rope_parameters: factor: a RoPE scaling without rope_type"));
  spec.rope_scaling.factor = 0.5;
  CHECK_THROWS_WITH(megaplan::validate_model_spec(spec),
                    Contains("--rope-scaling-factor: must be a finite number >= 1"));
  spec.rope_scaling.factor = 8;
  spec.position_embedding_type = megaplan::PositionEmbedding::kLearnedAbsolute;
  CHECK_THROWS_WITH(megaplan::validate_model_spec(spec),
                    Contains("--use-rope-scaling: needs --position-embedding-type rope"));
}

TEST_CASE("a megaplan model file loads by path", "[hf_config]") {
  const megaplan::ModelSpec spec = megaplan::load_model_spec(kExamples + "/models/tiny-gpt.json");
  CHECK(spec.name == "tiny-gpt");
  CHECK(spec.num_layers == 2);
  CHECK(megaplan::padded_vocab_size(spec, 1) == 256);
}
