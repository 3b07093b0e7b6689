// Mixture of experts as Megatron-Core configures it (issue 40): which layers hold an MoE layer
// in place of the dense MLP, how wide and how many experts, and how the router chooses and
// balances them — the flags' meanings, their rules and their JSON, in one place. Described here
// and counted by core/formulas.h; train runs its MoE layers (core/layer_recipe.h's MoeDims, within
// core/executor_support.h's limits); simulate costs them where train runs them
// (core/moe_kernel_list.h), and search ranks those layouts over ep (planner/search_space.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace megaplan {

class JsonFieldReader;

// --moe-router-score-function.
enum class RouterScoreFunction : uint8_t { kSoftmax, kSigmoid };
// --moe-router-load-balancing-type: the switch loss over a microbatch's tokens (aux_loss), over
// each sequence's (seq_aux_loss, DeepSeek-V2/V3's), or none.
enum class LoadBalancing : uint8_t { kAuxLoss, kSeqAuxLoss, kNone };
// --moe-token-drop-policy: an expert over its capacity keeps its most probable routes, or its earliest.
enum class TokenDropPolicy : uint8_t { kProbs, kPosition };
// --moe-token-dispatcher-type: how tokens reach their experts across expert-parallel ranks: one
// all-to-all each way (alltoall, what megaplan runs and its default), every rank gathering every
// token (allgather, Megatron's argparse default), or Megatron's flex dispatcher (DeepEP).
enum class TokenDispatcher : uint8_t { kAllToAll, kAllGather, kFlex };

std::string to_string(RouterScoreFunction score);
std::string to_string(LoadBalancing balancing);
std::string to_string(TokenDropPolicy policy);
std::string to_string(TokenDispatcher dispatcher);  // "alltoall", "allgather", "flex"
// Each throws SpecError(field, ...) listing the accepted spellings.
RouterScoreFunction parse_router_score_function(const std::string& text, const std::string& field);
LoadBalancing parse_load_balancing(const std::string& text, const std::string& field);
TokenDropPolicy parse_token_drop_policy(const std::string& text, const std::string& field);
TokenDispatcher parse_token_dispatcher(const std::string& text, const std::string& field);

struct MoeSpec {
  int64_t num_experts = 0;                      // --num-experts; 0: a dense model
  int64_t ffn_hidden_size = 0;                  // --moe-ffn-hidden-size; 0: the model's ffn_hidden_size
  int64_t router_topk = 0;                      // --moe-router-topk; 0: Megatron's default, 2
  int64_t shared_expert_intermediate_size = 0;  // --moe-shared-expert-intermediate-size; 0: none
  bool shared_expert_gate = false;              // --moe-shared-expert-gate: sigmoid(x·g) scales the shared expert
  // --moe-layer-freq: every layer_freq-th layer from layer 0 holds experts, or layer_pattern says
  // layer by layer (1: experts, 0: the dense MLP) when not empty.
  int64_t layer_freq = 1;
  std::vector<int64_t> layer_pattern;
  RouterScoreFunction score_function = RouterScoreFunction::kSoftmax;
  bool router_pre_softmax = false;                   // --moe-router-pre-softmax: scores before the top k
  std::optional<double> router_topk_scaling_factor;  // --moe-router-topk-scaling-factor
  LoadBalancing load_balancing = LoadBalancing::kAuxLoss;
  double aux_loss_coeff = 0;                     // --moe-aux-loss-coeff (Megatron's default 0: the loss is not applied)
  double z_loss_coeff = 0;                       // --moe-z-loss-coeff
  bool router_enable_expert_bias = false;        // --moe-router-enable-expert-bias: aux-loss-free balancing
  double router_bias_update_rate = 1e-3;         // --moe-router-bias-update-rate
  std::optional<double> expert_capacity_factor;  // --moe-expert-capacity-factor; none: dropless
  bool pad_expert_input_to_capacity = false;     // --moe-pad-expert-input-to-capacity
  TokenDropPolicy token_drop_policy = TokenDropPolicy::kProbs;
  TokenDispatcher token_dispatcher = TokenDispatcher::kAllToAll;

  bool enabled() const { return num_experts > 0; }
  int64_t effective_router_topk() const { return router_topk > 0 ? router_topk : 2; }
  // Whether transformer layer `layer` (0-based, of the whole model) holds experts.
  bool moe_layer(int64_t layer) const {
    if (!enabled()) return false;
    if (!layer_pattern.empty()) return layer_pattern[static_cast<std::size_t>(layer)] != 0;
    return layer % layer_freq == 0;
  }
  // How many of the layers [first, first + count) hold experts.
  int64_t moe_layers(int64_t first, int64_t count) const;
};

// Megatron's get_capacity for `tokens` tokens' top-k routes over `experts` experts:
// ceil(tokens·k / experts · factor), each expert's most rows under --moe-expert-capacity-factor.
int64_t moe_expert_capacity(int64_t tokens, int64_t topk, int64_t experts, double capacity_factor);

// Megatron's --moe-layer-freq: an integer, or a Python list expression of 0s and 1s as Megatron
// evaluates it: "[1,0,1,0]", "([1]*3+[0]*1)*3". Sets `moe.layer_freq` or `moe.layer_pattern`;
// throws SpecError(field, ...) for anything else.
void parse_moe_layer_freq(const std::string& text, const std::string& field, MoeSpec& moe);
// The flag's value as Megatron-LM takes it back: "2", or "[1,0,1,0]".
std::string moe_layer_freq_text(const MoeSpec& moe);

// Megatron's rules (TransformerConfig's and validate_args'), each SpecError naming the flag: sizes
// and rates in range, the pattern one entry per layer, companions only with --num-experts, top 1
// only with the softmax before the choice, the expert bias only with sigmoid scores, padding only
// with a capacity, and what megaplan does not model refused by name.
void validate_moe_spec(const MoeSpec& moe, int64_t num_layers);

// The "num_experts" ... "moe_token_drop_policy" keys of a model file (Megatron's names; the layer
// pattern an integer or a list); written only for a model with experts, each read key checked by
// validate_moe_spec. `reader` reads `json`.
void write_moe_spec(const MoeSpec& moe, nlohmann::json& json);
void read_moe_spec(const nlohmann::json& json, JsonFieldReader& reader, MoeSpec& moe);

}  // namespace megaplan
