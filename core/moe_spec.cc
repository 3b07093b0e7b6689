// Mixture of experts' settings: spellings, --moe-layer-freq, Megatron's rules, JSON (see moe_spec.h).
#include "core/moe_spec.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/input_limits.h"
#include "core/json_io.h"

namespace megaplan {

namespace {

// A flag's text as an error line shows it: at most 64 characters.
std::string shown(const std::string& text) { return text.size() <= 64 ? text : text.substr(0, 61) + "..."; }

}  // namespace

std::string to_string(RouterScoreFunction score) {
  return score == RouterScoreFunction::kSoftmax ? "softmax" : "sigmoid";
}

std::string to_string(LoadBalancing balancing) {
  switch (balancing) {
    case LoadBalancing::kAuxLoss: return "aux_loss";
    case LoadBalancing::kSeqAuxLoss: return "seq_aux_loss";
    case LoadBalancing::kNone: return "none";
  }
  return "none";
}

std::string to_string(TokenDropPolicy policy) { return policy == TokenDropPolicy::kProbs ? "probs" : "position"; }

std::string to_string(TokenDispatcher dispatcher) {
  switch (dispatcher) {
    case TokenDispatcher::kAllToAll: return "alltoall";
    case TokenDispatcher::kAllGather: return "allgather";
    case TokenDispatcher::kFlex: break;
  }
  return "flex";
}

TokenDispatcher parse_token_dispatcher(const std::string& text, const std::string& field) {
  if (text == "alltoall") return TokenDispatcher::kAllToAll;
  if (text == "allgather") return TokenDispatcher::kAllGather;
  if (text == "flex") return TokenDispatcher::kFlex;
  throw SpecError(field, "must be alltoall, allgather or flex, got \"" + shown(text) + "\"");
}

RouterScoreFunction parse_router_score_function(const std::string& text, const std::string& field) {
  if (text == "softmax") return RouterScoreFunction::kSoftmax;
  if (text == "sigmoid") return RouterScoreFunction::kSigmoid;
  if (text == "sqrtsoftplus") throw SpecError(field, "sqrtsoftplus scores are not modelled; use softmax or sigmoid");
  throw SpecError(field, "must be softmax or sigmoid, got \"" + shown(text) + "\"");
}

LoadBalancing parse_load_balancing(const std::string& text, const std::string& field) {
  if (text == "aux_loss") return LoadBalancing::kAuxLoss;
  if (text == "seq_aux_loss") return LoadBalancing::kSeqAuxLoss;
  if (text == "none") return LoadBalancing::kNone;
  if (text == "global_aux_loss" || text == "sinkhorn" || text == "quantile_balancing") {
    throw SpecError(field, text + " balancing is not modelled; use aux_loss, seq_aux_loss or none");
  }
  throw SpecError(field, "must be aux_loss, seq_aux_loss or none, got \"" + shown(text) + "\"");
}

TokenDropPolicy parse_token_drop_policy(const std::string& text, const std::string& field) {
  if (text == "probs") return TokenDropPolicy::kProbs;
  if (text == "position") return TokenDropPolicy::kPosition;
  throw SpecError(field, "must be probs or position, got \"" + shown(text) + "\"");
}

int64_t MoeSpec::moe_layers(int64_t first, int64_t count) const {
  if (!enabled()) return 0;  // a dense model's counts, asked for on the planner's paths, take no walk
  int64_t layers = 0;
  for (int64_t layer = first; layer < first + count; ++layer) layers += moe_layer(layer) ? 1 : 0;
  return layers;
}

namespace {

// Megatron evaluates the pattern as Python after allowing only ",0-9[]()+*"; this reads that
// language: lists of integers, joined by + and repeated by * n, in parentheses.
class PatternParser {
 public:
  PatternParser(const std::string& text, std::string field) : text_(text), field_(std::move(field)) {}

  std::vector<int64_t> parse() {
    std::vector<int64_t> pattern = sum();
    if (at_ != text_.size()) fail("unexpected '" + std::string(1, text_[at_]) + "'");
    return pattern;
  }

 private:
  std::vector<int64_t> sum() {
    std::vector<int64_t> result = product();
    while (take('+')) {
      const std::vector<int64_t> more = product();
      grow(result, more.size());
      result.insert(result.end(), more.begin(), more.end());
    }
    return result;
  }
  std::vector<int64_t> product() {
    std::vector<int64_t> result = factor();
    while (take('*')) {
      const int64_t times = integer();
      if (times < 0) fail("a repeat count must not be negative");
      const std::vector<int64_t> once = result;
      result.clear();
      for (int64_t i = 0; i < times; ++i) {
        grow(result, once.size());
        result.insert(result.end(), once.begin(), once.end());
      }
    }
    return result;
  }
  std::vector<int64_t> factor() {
    if (take('(')) {
      // Parentheses nest by recursion: a bound keeps hostile text from exhausting the stack.
      if (++depth_ > kMaxDepth) fail("parentheses nested deeper than " + std::to_string(kMaxDepth));
      std::vector<int64_t> inner = sum();
      if (!take(')')) fail("a '(' is not closed");
      --depth_;
      return inner;
    }
    if (!take('[')) fail("expected '[' or '('");
    std::vector<int64_t> list;
    if (take(']')) return list;
    do {
      grow(list, 1);
      list.push_back(integer());
    } while (take(','));
    if (!take(']')) fail("a '[' is not closed");
    return list;
  }
  int64_t integer() {
    const std::size_t start = at_;
    int64_t value = 0;
    while (at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9') {
      value = value * 10 + (text_[at_++] - '0');
      if (value > kMaxLayers.most) fail("a number above " + std::to_string(kMaxLayers.most));
    }
    if (at_ == start) fail("expected a number");
    return value;
  }
  bool take(char c) {
    if (at_ < text_.size() && text_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }
  // A pattern names one entry per layer: anything longer than the most layers is refused as it grows.
  void grow(const std::vector<int64_t>& list, std::size_t more) const {
    if (list.size() + more > static_cast<std::size_t>(kMaxLayers.most)) {
      fail("the pattern is longer than " + std::to_string(kMaxLayers.most) + " layers");
    }
  }
  [[noreturn]] void fail(const std::string& why) const {
    throw SpecError(
        field_, "must be an integer or a list pattern such as ([1]*3+[0])*2: " + why + " in \"" + shown(text_) + "\"");
  }

  static constexpr int kMaxDepth = 32;
  const std::string& text_;
  std::string field_;
  std::size_t at_ = 0;
  int depth_ = 0;
};

}  // namespace

void parse_moe_layer_freq(const std::string& text, const std::string& field, MoeSpec& moe) {
  if (text.find('[') == std::string::npos) {
    std::size_t used = 0;
    int64_t freq = 0;
    try {
      freq = std::stoll(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != text.size()) {
      throw SpecError(field, "must be an integer or a list pattern such as ([1]*3+[0])*2, got \"" + shown(text) + "\"");
    }
    moe.layer_freq = freq;
    moe.layer_pattern.clear();
    return;
  }
  moe.layer_pattern = PatternParser(text, field).parse();
  moe.layer_freq = 1;
}

std::string moe_layer_freq_text(const MoeSpec& moe) {
  if (moe.layer_pattern.empty()) return std::to_string(moe.layer_freq);
  std::string text = "[";
  for (std::size_t i = 0; i < moe.layer_pattern.size(); ++i) {
    text += (i == 0 ? "" : ",") + std::to_string(moe.layer_pattern[i]);
  }
  return text + "]";
}

namespace {

void require_not_negative(double value, const char* flag) {
  if (!std::isfinite(value) || value < 0) {
    throw SpecError(flag, "must be 0 or more, got " + nlohmann::json(value).dump());
  }
}

void require_positive_real(const std::optional<double>& value, const char* flag) {
  if (value && (!std::isfinite(*value) || *value <= 0)) {
    throw SpecError(flag, "must be positive, got " + nlohmann::json(*value).dump());
  }
}

}  // namespace

void validate_moe_spec(const MoeSpec& moe, int64_t num_layers) {
  if (!moe.enabled()) {
    if (moe.num_experts < 0) {
      throw SpecError("--num-experts", "must be a positive integer, got " + std::to_string(moe.num_experts));
    }
    // An expert's companions without experts would be read and then ignored.
    const MoeSpec dense;
    const std::pair<bool, const char*> companions[] = {
        {moe.ffn_hidden_size != 0, "--moe-ffn-hidden-size"},
        {moe.router_topk != 0, "--moe-router-topk"},
        {moe.shared_expert_intermediate_size != 0, "--moe-shared-expert-intermediate-size"},
        {moe.shared_expert_gate, "--moe-shared-expert-gate"},
        {moe.layer_freq != dense.layer_freq || !moe.layer_pattern.empty(), "--moe-layer-freq"},
        {moe.score_function != dense.score_function, "--moe-router-score-function"},
        {moe.router_pre_softmax, "--moe-router-pre-softmax"},
        {moe.router_topk_scaling_factor.has_value(), "--moe-router-topk-scaling-factor"},
        {moe.load_balancing != dense.load_balancing, "--moe-router-load-balancing-type"},
        {moe.aux_loss_coeff != dense.aux_loss_coeff, "--moe-aux-loss-coeff"},
        {moe.z_loss_coeff != dense.z_loss_coeff, "--moe-z-loss-coeff"},
        {moe.router_enable_expert_bias, "--moe-router-enable-expert-bias"},
        {moe.router_bias_update_rate != dense.router_bias_update_rate, "--moe-router-bias-update-rate"},
        {moe.expert_capacity_factor.has_value(), "--moe-expert-capacity-factor"},
        {moe.pad_expert_input_to_capacity, "--moe-pad-expert-input-to-capacity"},
        {moe.token_drop_policy != dense.token_drop_policy, "--moe-token-drop-policy"},
        {moe.token_dispatcher != dense.token_dispatcher, "--moe-token-dispatcher-type"}};
    for (const auto& [given, flag] : companions) {
      if (given) throw SpecError(flag, "needs --num-experts (a dense model has no experts)");
    }
    return;
  }
  require_at_most(moe.num_experts, kMaxExperts, "--num-experts");
  const int64_t topk = moe.effective_router_topk();
  if (moe.router_topk < 0 || topk > moe.num_experts) {
    throw SpecError("--moe-router-topk", "must lie in [1, --num-experts] = [1, " + std::to_string(moe.num_experts) +
                                             "], got " + std::to_string(topk));
  }
  if (moe.ffn_hidden_size < 0) {
    throw SpecError("--moe-ffn-hidden-size", "must be a positive integer, got " + std::to_string(moe.ffn_hidden_size));
  }
  require_at_most(moe.ffn_hidden_size, kMaxHiddenSize, "--moe-ffn-hidden-size");
  if (moe.shared_expert_intermediate_size < 0) {
    throw SpecError("--moe-shared-expert-intermediate-size",
                    "must be 0 (none) or more, got " + std::to_string(moe.shared_expert_intermediate_size));
  }
  require_at_most(moe.shared_expert_intermediate_size, kMaxHiddenSize, "--moe-shared-expert-intermediate-size");
  if (moe.shared_expert_gate && moe.shared_expert_intermediate_size == 0) {
    throw SpecError("--moe-shared-expert-gate", "needs a shared expert (--moe-shared-expert-intermediate-size)");
  }
  if (moe.layer_pattern.empty()) {
    if (moe.layer_freq < 1) {
      throw SpecError("--moe-layer-freq", "must be at least 1, got " + std::to_string(moe.layer_freq));
    }
  } else {
    if (static_cast<int64_t>(moe.layer_pattern.size()) != num_layers) {
      throw SpecError("--moe-layer-freq", "the pattern names " + std::to_string(moe.layer_pattern.size()) +
                                              " layers; the model has " + std::to_string(num_layers));
    }
    for (int64_t entry : moe.layer_pattern) {
      if (entry != 0 && entry != 1) {
        throw SpecError("--moe-layer-freq",
                        "a pattern's entries are 1 (experts) or 0 (dense), got " + std::to_string(entry));
      }
    }
  }
  if (moe.moe_layers(0, num_layers) == 0) {
    throw SpecError("--moe-layer-freq", "gives no layer experts; leave out --num-experts for a dense model");
  }
  // Softmax over the chosen one alone is 1 whatever the logits: nothing would train the router.
  if (topk == 1 && moe.score_function == RouterScoreFunction::kSoftmax && !moe.router_pre_softmax) {
    throw SpecError("--moe-router-topk",
                    "1 needs --moe-router-pre-softmax (a softmax over one choice has no gradient), as Megatron rules");
  }
  require_positive_real(moe.router_topk_scaling_factor, "--moe-router-topk-scaling-factor");
  require_not_negative(moe.aux_loss_coeff, "--moe-aux-loss-coeff");
  require_not_negative(moe.z_loss_coeff, "--moe-z-loss-coeff");
  require_not_negative(moe.router_bias_update_rate, "--moe-router-bias-update-rate");
  if (moe.router_enable_expert_bias && moe.score_function != RouterScoreFunction::kSigmoid) {
    throw SpecError("--moe-router-enable-expert-bias",
                    "needs --moe-router-score-function sigmoid (aux-loss-free routing), as Megatron rules");
  }
  require_positive_real(moe.expert_capacity_factor, "--moe-expert-capacity-factor");
  if (moe.pad_expert_input_to_capacity && !moe.expert_capacity_factor) {
    throw SpecError("--moe-pad-expert-input-to-capacity",
                    "needs --moe-expert-capacity-factor (dropless has no capacity)");
  }
  if (moe.token_drop_policy != TokenDropPolicy::kProbs && !moe.expert_capacity_factor) {
    throw SpecError("--moe-token-drop-policy", "needs --moe-expert-capacity-factor (dropless drops no token)");
  }
}

void write_moe_spec(const MoeSpec& moe, nlohmann::json& json) {
  if (!moe.enabled()) return;
  json["num_experts"] = moe.num_experts;
  json["moe_router_topk"] = moe.effective_router_topk();
  json["moe_shared_expert_intermediate_size"] = moe.shared_expert_intermediate_size;
  if (moe.shared_expert_gate) json["moe_shared_expert_gate"] = true;
  if (moe.layer_pattern.empty()) {
    json["moe_layer_freq"] = moe.layer_freq;
  } else {
    json["moe_layer_freq"] = moe.layer_pattern;
  }
  json["moe_router_score_function"] = to_string(moe.score_function);
  json["moe_router_pre_softmax"] = moe.router_pre_softmax;
  if (moe.router_topk_scaling_factor) json["moe_router_topk_scaling_factor"] = *moe.router_topk_scaling_factor;
  json["moe_router_load_balancing_type"] = to_string(moe.load_balancing);
  json["moe_aux_loss_coeff"] = moe.aux_loss_coeff;
  json["moe_z_loss_coeff"] = moe.z_loss_coeff;
  json["moe_router_enable_expert_bias"] = moe.router_enable_expert_bias;
  json["moe_router_bias_update_rate"] = moe.router_bias_update_rate;
  json["moe_token_dispatcher_type"] = to_string(moe.token_dispatcher);
  if (moe.expert_capacity_factor) {
    json["moe_expert_capacity_factor"] = *moe.expert_capacity_factor;
    json["moe_pad_expert_input_to_capacity"] = moe.pad_expert_input_to_capacity;
    json["moe_token_drop_policy"] = to_string(moe.token_drop_policy);
  }
}

void read_moe_spec(const nlohmann::json& json, JsonFieldReader& reader, MoeSpec& moe) {
  reader.read("num_experts", moe.num_experts);
  reader.read("moe_ffn_hidden_size", moe.ffn_hidden_size);
  reader.read("moe_router_topk", moe.router_topk);
  reader.read("moe_shared_expert_intermediate_size", moe.shared_expert_intermediate_size);
  reader.read("moe_shared_expert_gate", moe.shared_expert_gate);
  // An integer, or the pattern as a list.
  if (json.contains("moe_layer_freq") && json.at("moe_layer_freq").is_array()) {
    reader.read("moe_layer_freq", moe.layer_pattern);
  } else {
    reader.read("moe_layer_freq", moe.layer_freq);
  }
  std::string text;
  if (reader.read("moe_router_score_function", text)) {
    moe.score_function = parse_router_score_function(text, reader.field("moe_router_score_function"));
  }
  reader.read("moe_router_pre_softmax", moe.router_pre_softmax);
  double value = 0;
  if (reader.read("moe_router_topk_scaling_factor", value)) moe.router_topk_scaling_factor = value;
  if (reader.read("moe_router_load_balancing_type", text)) {
    moe.load_balancing = parse_load_balancing(text, reader.field("moe_router_load_balancing_type"));
  }
  reader.read("moe_aux_loss_coeff", moe.aux_loss_coeff);
  reader.read("moe_z_loss_coeff", moe.z_loss_coeff);
  reader.read("moe_router_enable_expert_bias", moe.router_enable_expert_bias);
  reader.read("moe_router_bias_update_rate", moe.router_bias_update_rate);
  if (reader.read("moe_expert_capacity_factor", value)) moe.expert_capacity_factor = value;
  reader.read("moe_pad_expert_input_to_capacity", moe.pad_expert_input_to_capacity);
  if (reader.read("moe_token_drop_policy", text)) {
    moe.token_drop_policy = parse_token_drop_policy(text, reader.field("moe_token_drop_policy"));
  }
  if (reader.read("moe_token_dispatcher_type", text)) {
    moe.token_dispatcher = parse_token_dispatcher(text, reader.field("moe_token_dispatcher_type"));
  }
}

int64_t moe_expert_capacity(int64_t tokens, int64_t topk, int64_t experts, double capacity_factor) {
  return static_cast<int64_t>(
      std::ceil(static_cast<double>(tokens * topk) / static_cast<double>(experts) * capacity_factor));
}

}  // namespace megaplan
