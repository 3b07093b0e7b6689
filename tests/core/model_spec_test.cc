// ModelSpec: Megatron defaults, vocabulary padding, every validation rule, strict JSON.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/model_presets.h"
#include "core/model_spec.h"

using Catch::Matchers::Contains;
using megaplan::ModelSpec;
using megaplan::SpecError;

namespace {

ModelSpec small_gpt() {
  ModelSpec spec;
  spec.name = "small";
  spec.num_layers = 4;
  spec.hidden_size = 256;
  spec.num_attention_heads = 8;
  spec.seq_length = 512;
  spec.vocab_size = 50257;
  return spec;
}

}  // namespace

TEST_CASE("Megatron's defaults fill unset fields", "[model_spec]") {
  ModelSpec spec = small_gpt();
  CHECK(spec.effective_ffn_hidden_size() == 1024);
  CHECK(spec.effective_num_query_groups() == 8);
  CHECK(spec.effective_kv_channels() == 32);
  CHECK(spec.effective_max_position_embeddings() == 512);
  spec.hidden_size = 4096;
  spec.swiglu = true;
  // int((4 * 4096 * 2 / 3) / 64) * 64 = 10880
  CHECK(spec.effective_ffn_hidden_size() == 10880);
}

TEST_CASE("vocabulary pads to a multiple of 128 * tp", "[model_spec]") {
  const ModelSpec spec = small_gpt();
  CHECK(megaplan::padded_vocab_size(spec, 1) == 50304);
  CHECK(megaplan::padded_vocab_size(spec, 2) == 50432);
  CHECK(megaplan::padded_vocab_size(spec, 8) == 51200);
  ModelSpec exact = spec;
  exact.vocab_size = 128256;  // already a multiple of 128
  CHECK(megaplan::padded_vocab_size(exact, 1) == 128256);
}

TEST_CASE("every validation rule names its field", "[model_spec]") {
  CHECK_NOTHROW(megaplan::validate_model_spec(small_gpt()));
  struct Case {
    const char* name;
    void (*mutate)(ModelSpec&);
    const char* message;
  };
  const Case cases[] = {
      {"zero layers", [](ModelSpec& s) { s.num_layers = 0; }, "--num-layers: must be a positive integer, got 0"},
      {"negative hidden", [](ModelSpec& s) { s.hidden_size = -8; },
       "--hidden-size: must be a positive integer, got -8"},
      {"zero heads", [](ModelSpec& s) { s.num_attention_heads = 0; }, "--num-attention-heads: must be a positive"},
      {"zero seq", [](ModelSpec& s) { s.seq_length = 0; }, "--seq-length: must be a positive"},
      {"zero vocab", [](ModelSpec& s) { s.vocab_size = 0; }, "--vocab-size: must be a positive"},
      {"zero padding", [](ModelSpec& s) { s.make_vocab_size_divisible_by = 0; },
       "--make-vocab-size-divisible-by: must be a positive"},
      {"negative ffn", [](ModelSpec& s) { s.ffn_hidden_size = -1; },
       "--ffn-hidden-size: must be a positive integer, got -1"},
      {"negative groups", [](ModelSpec& s) { s.num_query_groups = -2; }, "--num-query-groups: must be a positive"},
      {"negative kv channels", [](ModelSpec& s) { s.kv_channels = -2; }, "--kv-channels: must be a positive"},
      {"negative positions", [](ModelSpec& s) { s.max_position_embeddings = -2; },
       "--max-position-embeddings: must be a positive"},
      {"hidden not divisible by heads", [](ModelSpec& s) { s.num_attention_heads = 12; },
       "--hidden-size: must be divisible by --num-attention-heads (256 % 12 != 0)"},
      {"groups do not divide heads", [](ModelSpec& s) { s.num_query_groups = 3; },
       "--num-query-groups: must divide --num-attention-heads (8 heads, 3 groups)"},
      {"negative experts", [](ModelSpec& s) { s.moe.num_experts = -1; },
       "--num-experts: must be a positive integer, got -1"},
      {"top k above the experts",
       [](ModelSpec& s) {
         s.moe.num_experts = 4;
         s.moe.router_topk = 5;
       },
       "--moe-router-topk: must lie in [1, --num-experts] = [1, 4], got 5"},
      {"experts' width without experts", [](ModelSpec& s) { s.moe.ffn_hidden_size = 512; },
       "--moe-ffn-hidden-size: needs --num-experts (a dense model has no experts)"},
      {"a shared expert without experts", [](ModelSpec& s) { s.moe.shared_expert_intermediate_size = 512; },
       "--moe-shared-expert-intermediate-size: needs --num-experts"},
      {"too many experts", [](ModelSpec& s) { s.moe.num_experts = 1 << 20; }, "--num-experts: must be at most"},
      // Megatron's router rules (core/moe_spec.h), on a model of 4 layers with 4 experts.
      {"a layer pattern without experts", [](ModelSpec& s) { s.moe.layer_freq = 2; },
       "--moe-layer-freq: needs --num-experts (a dense model has no experts)"},
      {"an aux-loss weight without experts", [](ModelSpec& s) { s.moe.aux_loss_coeff = 0.01; },
       "--moe-aux-loss-coeff: needs --num-experts"},
      {"a pattern of 3 layers for 4",
       [](ModelSpec& s) {
         s.moe.num_experts = 4;
         s.moe.layer_pattern = {1, 0, 1};
       },
       "--moe-layer-freq: the pattern names 3 layers; the model has 4"},
      {"a pattern entry of 2",
       [](ModelSpec& s) {
         s.moe.num_experts = 4;
         s.moe.layer_pattern = {1, 0, 2, 0};
       },
       "--moe-layer-freq: a pattern's entries are 1 (experts) or 0 (dense), got 2"},
      {"a pattern without experts",
       [](ModelSpec& s) {
         s.moe.num_experts = 4;
         s.moe.layer_pattern = {0, 0, 0, 0};
       },
       "--moe-layer-freq: gives no layer experts"},
      {"a frequency of 0",
       [](ModelSpec& s) {
         s.moe.num_experts = 4;
         s.moe.layer_freq = 0;
       },
       "--moe-layer-freq: must be at least 1, got 0"},
      {"top 1 after the softmax",
       [](ModelSpec& s) {
         s.moe.num_experts = 4;
         s.moe.router_topk = 1;
       },
       "--moe-router-topk: 1 needs --moe-router-pre-softmax"},
      {"an expert bias on softmax scores",
       [](ModelSpec& s) {
         s.moe.num_experts = 4;
         s.moe.router_enable_expert_bias = true;
       },
       "--moe-router-enable-expert-bias: needs --moe-router-score-function sigmoid"},
      {"padding without a capacity",
       [](ModelSpec& s) {
         s.moe.num_experts = 4;
         s.moe.pad_expert_input_to_capacity = true;
       },
       "--moe-pad-expert-input-to-capacity: needs --moe-expert-capacity-factor"},
      {"a dispatcher without experts", [](ModelSpec& s) { s.moe.token_dispatcher = megaplan::TokenDispatcher::kFlex; },
       "--moe-token-dispatcher-type: needs --num-experts (a dense model has no experts)"},
      {"a drop policy without a capacity",
       [](ModelSpec& s) {
         s.moe.num_experts = 4;
         s.moe.token_drop_policy = megaplan::TokenDropPolicy::kPosition;
       },
       "--moe-token-drop-policy: needs --moe-expert-capacity-factor"},
      {"a capacity of 0",
       [](ModelSpec& s) {
         s.moe.num_experts = 4;
         s.moe.expert_capacity_factor = 0.0;
       },
       "--moe-expert-capacity-factor: must be positive, got 0.0"},
      {"a negative z-loss weight",
       [](ModelSpec& s) {
         s.moe.num_experts = 4;
         s.moe.z_loss_coeff = -1e-3;
       },
       "--moe-z-loss-coeff: must be 0 or more, got -0.001"},
      {"a gate without a shared expert",
       [](ModelSpec& s) {
         s.moe.num_experts = 4;
         s.moe.shared_expert_gate = true;
       },
       "--moe-shared-expert-gate: needs a shared expert"},
      {"experts beyond 64 bits",
       [](ModelSpec& s) {
         s.num_layers = 4096;
         s.hidden_size = 1 << 20;
         s.num_attention_heads = 1 << 10;
         s.moe.num_experts = 1 << 14;
         s.moe.ffn_hidden_size = 1 << 20;
       },
       "overflows 64 bits"},
      {"more groups than heads", [](ModelSpec& s) { s.num_query_groups = 16; }, "--num-query-groups: must divide"},
      {"sequence beyond positions", [](ModelSpec& s) { s.max_position_embeddings = 256; },
       "--seq-length: must not exceed --max-position-embeddings (512 > 256)"},
      {"swiglu default rounds to zero",
       [](ModelSpec& s) {
         s.hidden_size = 16;
         s.num_attention_heads = 1;
         s.swiglu = true;
       },
       "--ffn-hidden-size: the SwiGLU default"},
      // Sizes past core/input_limits.h's bounds are refused before anything multiplies them.
      {"hidden size past its bound",
       [](ModelSpec& s) {
         s.hidden_size = int64_t{1} << 40;
         s.num_attention_heads = 1;
       },
       "--hidden-size: must be at most 1048576 (parameter counts multiply its square), got 1099511627776"},
      {"hidden size overflowing its defaults",
       [](ModelSpec& s) {
         s.hidden_size = int64_t{1} << 62;
         s.num_attention_heads = 1;
       },
       "--hidden-size: must be at most 1048576"},
      {"vocabulary at the 64-bit limit", [](ModelSpec& s) { s.vocab_size = INT64_MAX; },
       "--vocab-size: must be at most 16777216"},
      {"2^31 layers", [](ModelSpec& s) { s.num_layers = int64_t{1} << 31; }, "--num-layers: must be at most 4096"},
      {"a sequence of 2^40", [](ModelSpec& s) { s.seq_length = int64_t{1} << 40; },
       "--seq-length: must be at most 16777216"},
      {"zero epsilon", [](ModelSpec& s) { s.norm_epsilon = 0; }, "--norm-epsilon: must be in (0, 1), got 0.0"},
      {"rotary base of 1", [](ModelSpec& s) { s.rotary_base = 1; }, "--rotary-base: must be a finite number above 1"},
      {"rotary percent above 1", [](ModelSpec& s) { s.rotary_percent = 1.5; }, "--rotary-percent: must be in (0, 1]"},
      {"an odd count of rotated dimensions",
       [](ModelSpec& s) {
         s.position_embedding_type = megaplan::PositionEmbedding::kRope;
         s.rotary_percent = 0.3;  // 32 x 0.3 = 9
       },
       "--rotary-percent: must leave an even number of rotated dimensions, at least 2: --kv-channels 32 x 0.3 gives 9"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    ModelSpec spec = small_gpt();
    c.mutate(spec);
    CHECK_THROWS_WITH(megaplan::validate_model_spec(spec), Contains(c.message));
  }
  ModelSpec explicit_head_dim = small_gpt();
  explicit_head_dim.num_attention_heads = 12;
  explicit_head_dim.kv_channels = 64;  // heads need not divide hidden when the head dim is given
  CHECK_NOTHROW(megaplan::validate_model_spec(explicit_head_dim));
}

TEST_CASE("model JSON round-trips and rejects unknown or mistyped fields", "[model_spec]") {
  for (const megaplan::ModelPreset& preset : megaplan::model_presets()) {
    INFO(preset.spec.name);
    const nlohmann::json json = megaplan::model_spec_to_json(preset.spec);
    const ModelSpec back = megaplan::model_spec_from_json(json, "test.json");
    CHECK(megaplan::model_spec_to_json(back) == json);
  }
  // A model with experts and every router setting away from its default.
  ModelSpec moe = small_gpt();
  moe.moe.num_experts = 8;
  moe.moe.router_topk = 1;
  moe.moe.shared_expert_intermediate_size = 128;
  moe.moe.shared_expert_gate = true;
  moe.moe.layer_pattern = {0, 1, 1, 1};
  moe.moe.score_function = megaplan::RouterScoreFunction::kSigmoid;
  moe.moe.router_pre_softmax = true;
  moe.moe.router_topk_scaling_factor = 2.5;
  moe.moe.load_balancing = megaplan::LoadBalancing::kSeqAuxLoss;
  moe.moe.aux_loss_coeff = 1e-3;
  moe.moe.z_loss_coeff = 1e-4;
  moe.moe.router_enable_expert_bias = true;
  moe.moe.router_bias_update_rate = 1e-2;
  moe.moe.expert_capacity_factor = 1.25;
  moe.moe.pad_expert_input_to_capacity = true;
  moe.moe.token_drop_policy = megaplan::TokenDropPolicy::kPosition;
  moe.moe.token_dispatcher = megaplan::TokenDispatcher::kAllGather;
  CHECK_NOTHROW(megaplan::validate_model_spec(moe));
  const nlohmann::json moe_json = megaplan::model_spec_to_json(moe);
  CHECK(moe_json.at("moe_layer_freq") == nlohmann::json::array({0, 1, 1, 1}));
  CHECK(moe_json.at("moe_token_dispatcher_type") == "allgather");
  CHECK(megaplan::model_spec_to_json(megaplan::model_spec_from_json(moe_json, "moe.json")) == moe_json);
  nlohmann::json every_other = moe_json;
  every_other["moe_layer_freq"] = 2;
  CHECK(megaplan::model_spec_from_json(every_other, "moe.json").moe.moe_layers(0, 4) == 2);
  every_other["moe_router_score_function"] = "sqrtsoftplus";
  CHECK_THROWS_WITH(
      megaplan::model_spec_from_json(every_other, "moe.json"),
      "moe.json: moe_router_score_function: sqrtsoftplus scores are not modelled; use softmax or sigmoid");

  nlohmann::json json = megaplan::model_spec_to_json(small_gpt());
  json["num_layer"] = 3;
  CHECK_THROWS_WITH(megaplan::model_spec_from_json(json, "m.json"), "m.json: num_layer: unknown field");
  json.erase("num_layer");
  json["hidden_size"] = "256";
  CHECK_THROWS_WITH(megaplan::model_spec_from_json(json, "m.json"),
                    "m.json: hidden_size: must be an integer, got string \"256\"");
  json["hidden_size"] = 256;
  json["normalization"] = "BatchNorm";
  CHECK_THROWS_WITH(megaplan::model_spec_from_json(json, "m.json"),
                    "m.json: normalization: must be LayerNorm or RMSNorm, got \"BatchNorm\"");
  json.erase("normalization");
  json.erase("num_layers");
  CHECK_THROWS_WITH(megaplan::model_spec_from_json(json, "m.json"), "m.json: num_layers: required field is missing");
  json["num_layers"] = 18446744073709551615u;
  CHECK_THROWS_WITH(megaplan::model_spec_from_json(json, "m.json"), Contains("overflows 64 bits"));
}

TEST_CASE("--moe-layer-freq reads Megatron's integers and list patterns", "[model_spec]") {
  megaplan::MoeSpec moe;
  megaplan::parse_moe_layer_freq("2", "--moe-layer-freq", moe);
  CHECK(moe.layer_freq == 2);
  CHECK(moe.layer_pattern.empty());
  megaplan::parse_moe_layer_freq("([1]*3+[0]*1)*3", "--moe-layer-freq", moe);
  CHECK(moe.layer_pattern == std::vector<int64_t>{1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0});
  CHECK(megaplan::moe_layer_freq_text(moe) == "[1,1,1,0,1,1,1,0,1,1,1,0]");
  megaplan::parse_moe_layer_freq("[0]+[1]*23", "--moe-layer-freq", moe);
  CHECK(moe.layer_pattern.size() == 24);
  CHECK(moe.layer_pattern[0] == 0);
  megaplan::parse_moe_layer_freq("3", "--moe-layer-freq", moe);
  CHECK(moe.layer_pattern.empty());
  CHECK(megaplan::moe_layer_freq_text(moe) == "3");
  // A stack's worth of recursion, refused first; the error line shows the text's first 61 characters.
  const std::string deep = std::string(100000, '(') + "[1]";
  const std::string deep_refusal = "parentheses nested deeper than 32 in \"" + std::string(61, '(') + "...\"";
  const std::pair<const char*, const char*> refused[] = {
      {"two", "--moe-layer-freq: must be an integer or a list pattern such as ([1]*3+[0])*2, got \"two\""},
      {"[1,0", "a '[' is not closed in \"[1,0\""},
      {"([1]*2", "a '(' is not closed"},
      {"[1] * 2", "unexpected ' '"},
      {"[1]*99999", "a number above 4096"},
      {"[1]*4000*4000", "the pattern is longer than 4096 layers"},
      {"__import__('os')", "got \"__import__('os')\""},
      {"[__import__('os')]", "expected a number"},
      {"[1]+(", "expected '[' or '('"},
      {deep.c_str(), deep_refusal.c_str()},
  };
  for (const auto& [text, message] : refused) {
    INFO(text);
    megaplan::MoeSpec fresh;
    CHECK_THROWS_WITH(megaplan::parse_moe_layer_freq(text, "--moe-layer-freq", fresh), Contains(message));
  }
}
