// Implementation defaults, the conditions Megatron puts on its flags, and the JSON mapping.
#include "core/implementation_options.h"

#include <algorithm>
#include <array>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_io.h"
#include "core/model_spec.h"
#include "core/parallel_plan.h"
#include "core/parameter_layout.h"
#include "core/schedule/schedule_traits.h"

namespace megaplan {

namespace {

const std::pair<Implementation, const char*> kImplementationNames[] = {
    {Implementation::kMegaplan, "megaplan"},
    {Implementation::kMegatronCore, "megatron-core"},
    {Implementation::kMegatronLocal, "megatron-local"}};

const std::pair<TransformerImpl, const char*> kTransformerImplNames[] = {
    {TransformerImpl::kLocal, "local"}, {TransformerImpl::kTransformerEngine, "transformer_engine"}};

const std::pair<DdpImpl, const char*> kDdpImplNames[] = {{DdpImpl::kLocal, "local"}, {DdpImpl::kTorch, "torch"}};

// The on/off options: their JSON key, the Megatron flag that changes them, and whether megaplan's
// executor runs both settings (its own --overlap-grad-reduce and --overlap-param-gather).
struct SwitchField {
  bool ImplementationOptions::*member;
  const char* key;
  const char* flag;
  bool executor_runs_both = false;
};
constexpr std::array<SwitchField, 10> kSwitches = {{
    {&ImplementationOptions::use_flash_attn, "use_flash_attn", "--use-flash-attn"},
    {&ImplementationOptions::masked_softmax_fusion, "masked_softmax_fusion", "--no-masked-softmax-fusion"},
    {&ImplementationOptions::bias_gelu_fusion, "bias_gelu_fusion", "--no-bias-gelu-fusion"},
    {&ImplementationOptions::bias_dropout_fusion, "bias_dropout_fusion", "--no-bias-dropout-fusion"},
    {&ImplementationOptions::gradient_accumulation_fusion, "gradient_accumulation_fusion",
     "--no-gradient-accumulation-fusion"},
    {&ImplementationOptions::accumulate_allreduce_grads_in_fp32, "accumulate_allreduce_grads_in_fp32",
     "--accumulate-allreduce-grads-in-fp32"},
    {&ImplementationOptions::overlap_grad_reduce, "overlap_grad_reduce", "--overlap-grad-reduce", true},
    {&ImplementationOptions::overlap_param_gather, "overlap_param_gather", "--overlap-param-gather", true},
    {&ImplementationOptions::tp_comm_overlap, "tp_comm_overlap", "--tp-comm-overlap"},
    {&ImplementationOptions::scatter_gather_tensors_in_pipeline, "scatter_gather_tensors_in_pipeline",
     "--no-scatter-gather-tensors-in-pipeline"},
}};

template <typename Enum, std::size_t N>
std::string name_of(Enum value, const std::pair<Enum, const char*> (&names)[N]) {
  for (const auto& [candidate, name] : names) {
    if (candidate == value) return name;
  }
  return "?";
}

template <typename Enum, std::size_t N>
Enum parse_name(const std::string& text, const std::string& field, const std::pair<Enum, const char*> (&names)[N]) {
  std::string spellings;
  for (const auto& [value, name] : names) {
    if (text == name) return value;
    spellings += (spellings.empty() ? "" : ", ") + std::string(name);
  }
  throw SpecError(field, "must be one of " + spellings + "; got \"" + text + "\"");
}

// The same over values that name themselves (to_string).
template <typename Enum, std::size_t N>
Enum parse_name(const std::string& text, const std::string& field, const std::array<Enum, N>& values) {
  std::string spellings;
  for (const Enum value : values) {
    if (text == to_string(value)) return value;
    spellings += (spellings.empty() ? "" : ", ") + to_string(value);
  }
  throw SpecError(field, "must be one of " + spellings + "; got \"" + text + "\"");
}

// The field is a string_view, made a std::string only when thrown: the planner validates hundreds
// of thousands of plans, and the flags' names are too long for the short-string buffer.
void require_probability(double value, std::string_view field) {
  if (!(value >= 0 && value < 1)) {
    throw SpecError(std::string(field), "must be a dropout probability in [0, 1), got " + std::to_string(value));
  }
}

}  // namespace

std::string to_string(Implementation implementation) { return name_of(implementation, kImplementationNames); }
Implementation parse_implementation(const std::string& text, const std::string& field) {
  return parse_name(text, field, kImplementationNames);
}
std::string to_string(TransformerImpl transformer_impl) { return name_of(transformer_impl, kTransformerImplNames); }
TransformerImpl parse_transformer_impl(const std::string& text, const std::string& field) {
  return parse_name(text, field, kTransformerImplNames);
}
std::string to_string(DdpImpl ddp_impl) { return name_of(ddp_impl, kDdpImplNames); }
DdpImpl parse_ddp_impl(const std::string& text, const std::string& field) {
  return parse_name(text, field, kDdpImplNames);
}

ImplementationOptions default_implementation_options(Implementation implementation) {
  ImplementationOptions options;  // megaplan's executor
  if (implementation == Implementation::kMegaplan) return options;
  // Megatron-LM's argument defaults (bf16 accumulates in fp32 whatever the flag says).
  options.use_flash_attn = false;
  options.attention_dropout = 0.1;
  options.hidden_dropout = 0.1;
  options.accumulate_allreduce_grads_in_fp32 = false;
  if (implementation == Implementation::kMegatronCore) {
    options.transformer_impl = TransformerImpl::kTransformerEngine;
    options.overlap_param_gather = true;
    options.tp_comm_overlap = true;
    return options;
  }
  options.precision = DType::kFloat16;
  options.masked_softmax_fusion = false;
  options.gradient_accumulation_fusion = false;
  options.overlap_grad_reduce = false;
  options.scatter_gather_tensors_in_pipeline = true;
  return options;
}

ImplementationOptions default_implementation_options(Implementation implementation, const ModelSpec& model) {
  ImplementationOptions options = default_implementation_options(implementation);
  if (implementation != Implementation::kMegaplan && model.normalization == Normalization::kRMSNorm) {
    options.attention_dropout = 0;
    options.hidden_dropout = 0;
  }
  return options;
}

bool fused_attention(const ImplementationOptions& options) {
  return options.transformer_impl == TransformerImpl::kTransformerEngine || options.use_flash_attn;
}

int64_t main_gradient_bytes(const ImplementationOptions& options) {
  return options.precision == DType::kBFloat16 || options.accumulate_allreduce_grads_in_fp32 ? 4 : 2;
}

bool overlaps_gradient_reduction(const ParallelPlan& plan) {
  return (plan.options.overlap_grad_reduce || plan.options.ddp_impl == DdpImpl::kTorch) &&
         plan.gradient_group_size() > 1;
}

int64_t gradient_bucket_parameters(const ParallelPlan& plan) {
  if (plan.options.ddp_impl == DdpImpl::kTorch) return (int64_t{25} << 20) / main_gradient_bytes(plan.options);
  return static_cast<int64_t>(default_bucket_size(plan.gradient_group_size()));
}

bool overlaps_tensor_parallel_communication(const ParallelPlan& plan) {
  return plan.options.tp_comm_overlap && plan.options.transformer_impl == TransformerImpl::kTransformerEngine &&
         plan.sequence_parallel && plan.tensor_parallel_size > 1;
}

bool overlaps_parameter_gather(const ParallelPlan& plan) {
  return plan.options.overlap_param_gather && overlaps_gradient_reduction(plan) && plan.use_distributed_optimizer;
}

bool scatters_pipeline_transfers(const ParallelPlan& plan) {
  return plan.options.scatter_gather_tensors_in_pipeline && !plan.sequence_parallel && plan.tensor_parallel_size > 1;
}

std::string describe_implementation(const ParallelPlan& plan) {
  const ImplementationOptions& options = plan.options;
  const auto list = [](const std::vector<std::pair<bool, const char*>>& items) {
    std::string text;
    for (const auto& [on, name] : items) {
      if (on) text += (text.empty() ? "" : ", ") + std::string(name);
    }
    return text.empty() ? std::string("none") : text;
  };
  const bool executor = plan.implementation == Implementation::kMegaplan;
  std::ostringstream out;
  out << to_string(plan.implementation) << ": " << to_string(options.precision) << " with "
      << (main_gradient_bytes(options) == 4 ? "fp32" : "fp16") << " main gradients; "
      << (executor                                                          ? "its own layers"
          : options.transformer_impl == TransformerImpl::kTransformerEngine ? "Transformer Engine"
                                                                            : "local layers")
      << ", " << (fused_attention(options) ? "fused" : "unfused") << " attention; dropout " << options.attention_dropout
      << " attention, " << options.hidden_dropout << " hidden; fused: "
      << list({{!fused_attention(options) && options.masked_softmax_fusion, "masked softmax"},
               {options.bias_gelu_fusion, "bias-GELU"},
               {options.bias_dropout_fusion, "bias-dropout-add"},
               {options.gradient_accumulation_fusion, "gradient accumulation"}})
      << "; overlapped: "
      << list({{overlaps_gradient_reduction(plan), "gradient reduction"},
               {overlaps_parameter_gather(plan), "parameter gather"},
               {overlaps_tensor_parallel_communication(plan), "tp communication"}});
  if (scatters_pipeline_transfers(plan) && plan.pipeline_parallel_size > 1)
    out << "; scatter-gather pipeline transfers";
  if (options.ddp_impl == DdpImpl::kTorch) out << "; PyTorch DDP";
  return out.str();
}

void validate_implementation_options(const ParallelPlan& plan) {
  const ImplementationOptions& options = plan.options;
  require_probability(options.attention_dropout, "--attention-dropout");
  require_probability(options.hidden_dropout, "--hidden-dropout");
  if (options.ddp_impl == DdpImpl::kTorch) {
    // Legacy Megatron's own assertions: everything but plain fp16 gradients needs its local DDP.
    const std::string needs = "legacy Megatron runs it with its local DDP only";
    if (plan.implementation != Implementation::kMegatronLocal) {
      throw SpecError("--DDP-impl", "torch is legacy Megatron's (--implementation megatron-local)");
    }
    if (main_gradient_bytes(options) != 2) {
      throw SpecError("--DDP-impl", "torch cannot accumulate gradients in fp32 (bf16 always does): " + needs);
    }
    if (options.gradient_accumulation_fusion) {
      throw SpecError("--DDP-impl",
                      "torch cannot fuse gradient accumulation (--no-gradient-accumulation-fusion): " + needs);
    }
    if (plan.use_distributed_optimizer) {
      throw SpecError("--DDP-impl", "torch cannot run --use-distributed-optimizer: " + needs);
    }
  }
  if (plan.implementation != Implementation::kMegaplan) {
    check_schedule_runs(plan.implementation, plan.schedule);
    if (plan.context_parallel_size > 1 && options.transformer_impl != TransformerImpl::kTransformerEngine) {
      throw SpecError("--context-parallel-size",
                      "needs --transformer-impl transformer_engine: Megatron's context parallelism runs in Transformer "
                      "Engine's attention");
    }
    return;
  }
  const ImplementationOptions executor = default_implementation_options(Implementation::kMegaplan);
  // A C string, made a std::string only when thrown: the planner validates hundreds of thousands of plans.
  const char* const rule =
      "megaplan's executor does not run this (bf16 or fp16 with fp32 gradients, its own layers with flash attention, "
      "fused GELU and weight-gradient accumulation); --implementation megatron-core or megatron-local models it";
  if (options.transformer_impl != executor.transformer_impl) throw SpecError("--transformer-impl", rule);
  if (options.ddp_impl != executor.ddp_impl) throw SpecError("--DDP-impl", rule);
  for (const SwitchField& field : kSwitches) {
    if (!field.executor_runs_both && options.*field.member != executor.*field.member) throw SpecError(field.flag, rule);
  }
}

bool runs_schedule(Implementation implementation, ScheduleKind schedule) {
  return implementation == Implementation::kMegaplan || schedule_traits(schedule).megatron_native;
}

void check_schedule_runs(Implementation implementation, ScheduleKind schedule) {
  if (runs_schedule(implementation, schedule)) return;
  throw SpecError("--schedule", to_string(schedule) +
                                    " is not a Megatron-LM schedule (it runs 1f1b and interleaved); "
                                    "--implementation megaplan runs it");
}

nlohmann::json implementation_options_to_json(const ImplementationOptions& options) {
  nlohmann::json json = {{"precision", to_string(options.precision)},
                         {"transformer_impl", to_string(options.transformer_impl)},
                         {"attention_dropout", options.attention_dropout},
                         {"hidden_dropout", options.hidden_dropout}};
  for (const SwitchField& field : kSwitches) json[field.key] = options.*field.member;
  json["ddp_impl"] = to_string(options.ddp_impl);
  return json;
}

ImplementationOptions implementation_options_from_json(const nlohmann::json& json, const std::string& source,
                                                       Implementation implementation) {
  JsonFieldReader reader(json, source);
  ImplementationOptions options = default_implementation_options(implementation);
  std::string text;
  if (reader.read("precision", text))
    options.precision = parse_name(text, reader.field("precision"), kTrainingPrecisions);
  if (reader.read("transformer_impl", text)) {
    options.transformer_impl = parse_transformer_impl(text, reader.field("transformer_impl"));
  }
  if (reader.read("ddp_impl", text)) options.ddp_impl = parse_ddp_impl(text, reader.field("ddp_impl"));
  reader.read("attention_dropout", options.attention_dropout);
  reader.read("hidden_dropout", options.hidden_dropout);
  for (const SwitchField& field : kSwitches) reader.read(field.key, options.*field.member);
  reader.reject_unknown_keys();
  require_probability(options.attention_dropout, reader.field("attention_dropout"));
  require_probability(options.hidden_dropout, reader.field("hidden_dropout"));
  return options;
}

}  // namespace megaplan
