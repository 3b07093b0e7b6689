#include "planner/torchtitan_config.h"

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "core/model_presets.h"
#include "core/pipeline_layout.h"
#include "core/schedule/schedule_traits.h"
#include "core/units.h"

namespace megaplan::planner {

namespace {

// torchtitan's model kinds megaplan's models map to: Llama 3's (SwiGLU, RMSNorm, RoPE) and
// Qwen3's (the same with query and key norms, and its MoE variant).
enum class Kind { kLlama3, kQwen3, kQwen3Moe };

Kind kind_of(const ModelSpec& model) {
  if (model.moe.enabled()) return Kind::kQwen3Moe;
  return model.qk_layernorm ? Kind::kQwen3 : Kind::kLlama3;
}

const char* module_of(Kind kind) { return kind == Kind::kLlama3 ? "llama3" : "qwen3"; }

// The registry config a plan starts from where the model's flavour has none of its own.
const char* base_config_of(Kind kind) {
  switch (kind) {
    case Kind::kLlama3: return "llama3_8b";
    case Kind::kQwen3: return "qwen3_32b";
    default: return "qwen3_30b_a3b";
  }
}

// megaplan's presets as torchtitan's flavours (torchtitan/models/*/__init__.py), and the registry
// config function each has (config_registry.py; empty: none, the kind's base is used).
struct Flavour {
  const char* preset;
  const char* flavour;
  const char* config;
};
constexpr std::array<Flavour, 7> kFlavours{{{"llama3-8b", "8B", "llama3_8b"},
                                            {"llama3-70b", "70B", "llama3_70b"},
                                            {"llama3.1-405b", "405B", "llama3_405b"},
                                            {"qwen3-8b", "8B", ""},
                                            {"qwen3-32b", "32B", "qwen3_32b"},
                                            {"qwen3-30b-a3b", "30B-A3B", "qwen3_30b_a3b"},
                                            {"qwen3-235b-a22b", "235B-A22B", ""}}};

// The model's flavour: a preset's, where the model is that preset's shape (the sequence length
// is the run's, set apart).
const Flavour* flavour_of(const ModelSpec& model) {
  for (const Flavour& flavour : kFlavours) {
    if (model.name != flavour.preset) continue;
    ModelSpec preset = model_preset(flavour.preset);
    preset.seq_length = model.seq_length;
    return model_spec_to_json(preset) == model_spec_to_json(model) ? &flavour : nullptr;
  }
  return nullptr;
}

std::string quoted(const std::string& text) { return "\"" + text + "\""; }

}  // namespace

void require_torchtitan_model(const ModelSpec& model) {
  if (model.moe.enabled() && !model.qk_layernorm) {
    throw SpecError("--emit", "torchtitan has no model of " + model.name +
                                  "'s kind: its MoE model with grouped-query attention is qwen3, whose "
                                  "query and key heads are normalised (--qk-layernorm); use --emit megatron or launch");
  }
  if (model.qk_layernorm && !(model.swiglu && model.normalization == Normalization::kRMSNorm)) {
    throw SpecError("--emit",
                    "torchtitan's qwen3, the model with query and key norms, is SwiGLU and RMSNorm; use "
                    "--emit megatron or launch");
  }
}

void require_torchtitan_plan(const ModelSpec& model, const ParallelPlan& plan) {
  if (plan.options.precision == DType::kFloat16) {
    throw SpecError("--emit", "torchtitan trains in bf16 or fp32; this plan's precision is fp16");
  }
  if (!model.moe.enabled()) return;
  const int64_t ep = plan.expert_model_parallel_size, etp = plan.expert_tensor_parallel(),
                tp = plan.tensor_parallel_size;
  // Without expert parallelism torchtitan cuts the experts over tp; with it, each rank's experts
  // are whole (its ep group borrows the tp ranks).
  if (ep == 1 && etp != tp) {
    throw SpecError("--emit",
                    "torchtitan cuts experts over the tp group without expert parallelism; this plan's "
                    "--expert-tensor-parallel-size is " +
                        std::to_string(etp) + " under tp " + std::to_string(tp) + " (search with --etp " +
                        std::to_string(tp) + ")");
  }
  if (ep > 1 && etp != 1) {
    throw SpecError("--emit",
                    "torchtitan's experts are whole under expert parallelism; this plan's "
                    "--expert-tensor-parallel-size is " +
                        std::to_string(etp) + " (search with --etp 1)");
  }
  // The ep group is drawn from the sharded data-parallel, cp and tp ranks (efsdp x ep = those).
  const int64_t shard = plan.use_distributed_optimizer ? plan.data_parallel_size : 1;
  if (ep > 1 && (shard * plan.context_parallel_size * tp) % ep != 0) {
    throw SpecError("--emit", "torchtitan draws the ep group from the sharded data-parallel, cp and tp ranks (" +
                                  std::to_string(shard * plan.context_parallel_size * tp) + " here), which ep " +
                                  std::to_string(ep) + " must divide (search with --use-distributed-optimizer)");
  }
}

std::string torchtitan_config(const ModelSpec& model, const ParallelPlan& plan) {
  require_torchtitan_model(model);
  require_torchtitan_plan(model, plan);
  const Kind kind = kind_of(model);
  const std::string module = module_of(kind);
  const Flavour* flavour = flavour_of(model);
  const std::string config = flavour && *flavour->config ? flavour->config : base_config_of(kind);
  const bool own_spec = !flavour || !*flavour->config;  // the model_spec replaced

  std::string text = "# torchtitan config for megaplan's plan: " + describe_plan(plan) +
                     "\n# Save as megaplan_plan.py and run it on " + std::to_string(plan.world_size()) +
                     " GPUs (with torchrun's node flags across nodes):\n"
                     "#   PYTHONPATH=. torchrun --nproc-per-node GPUS_PER_NODE -m torchtitan.train --module "
                     "megaplan_plan --config megaplan_plan\n";
  if (plan.recompute_granularity == RecomputeGranularity::kSelective) {
    text += "from torchtitan.distributed.activation_checkpoint import SelectiveAC\n";
  } else if (plan.recompute_granularity == RecomputeGranularity::kFull) {
    text += "from torchtitan.distributed.activation_checkpoint import FullAC\n";
  }
  if (own_spec) {
    text += "from torchtitan.models.common.config_utils import decoder_vocab_size\n";
    text += "from torchtitan.models." + module + " import model_registry\n";
  }
  text += "from torchtitan.models." + module + ".config_registry import " + config + "\n\n\n";
  text += "def megaplan_plan():\n    config = " + config + "()\n";
  const auto set = [&](const std::string& field, const std::string& value) {
    text += "    config." + field + " = " + value + "\n";
  };
  const auto number = [&](const std::string& field, int64_t value) { set(field, std::to_string(value)); };
  const auto comment = [&](const std::string& line) { text += "    # " + line + "\n"; };

  if (own_spec) {
    if (flavour) {
      set("model_spec", "model_registry(" + quoted(flavour->flavour) + ")");
    } else {
      comment("torchtitan has no flavour of " + model.name + ": add one to " + module + "_configs (torchtitan/models/" +
              module + "/__init__.py) with dim " + std::to_string(model.hidden_size) + ", n_layers " +
              std::to_string(model.num_layers) + ", n_heads " + std::to_string(model.num_attention_heads) +
              ", n_kv_heads " + std::to_string(model.effective_num_query_groups()) + ", head_dim " +
              std::to_string(model.effective_kv_channels()) + ", vocab_size " + std::to_string(model.vocab_size) +
              (model.moe.enabled() ? ", num_experts " + std::to_string(model.moe.num_experts) + ", top_k " +
                                         std::to_string(model.moe.effective_router_topk()) + ", moe_hidden_dim " +
                                         std::to_string(model.moe.ffn_hidden_size)
                                   : ", hidden_dim " + std::to_string(model.ffn_hidden_size)) +
              (model.swiglu && model.normalization == Normalization::kRMSNorm
                   ? ""
                   : " (torchtitan's " + module + " is SwiGLU and RMSNorm)"));
      set("model_spec", "model_registry(" + quoted(model.name) + ")");
    }
    comment("the tokenizer is " + config + "'s: point hf_assets_path at this model's");
    set("loss.loss_fn.global_vocab_size", "decoder_vocab_size(config.model_spec)");
  }
  if (model.moe.enabled()) {
    const MoeSpec& moe = model.moe;
    // torchtitan's qwen3: an expert bias moved at 1e-3 (load_balance_coeff), no aux or z loss.
    std::vector<std::string> router;
    if (moe.aux_loss_coeff > 0)
      router.push_back(to_string(moe.load_balancing) + " at " + format_shortest(moe.aux_loss_coeff));
    if (moe.z_loss_coeff > 0) router.push_back("z loss at " + format_shortest(moe.z_loss_coeff));
    if (moe.router_enable_expert_bias) {
      router.push_back("an expert bias at rate " + format_shortest(moe.router_bias_update_rate));
    }
    if (router != std::vector<std::string>{"an expert bias at rate 0.001"}) {
      std::string ours = router.empty() ? "none" : router.front();
      for (std::size_t i = 1; i < router.size(); ++i) ours += ", " + router[i];
      comment("torchtitan's " + module + " balances its experts by an expert bias moved at rate 0.001 " +
              "(load_balance_coeff) and no aux or z loss; this model's balancing: " + ours);
    }
    if (moe.expert_capacity_factor) {
      comment("torchtitan's routed experts are dropless here; this model drops at capacity factor " +
              format_shortest(*moe.expert_capacity_factor));
    }
  }

  const int64_t dp = plan.data_parallel_size;
  const int64_t tokens = model.seq_length;
  number("training.max_context_length", tokens);
  // Tokens a data-parallel rank's forward takes (before cp and tp split them), and an iteration's.
  number("training.num_tokens_per_microbatch_per_dp_rank", plan.micro_batch_size * tokens);
  number("training.num_tokens_per_train_step", plan.global_batch_size * tokens);
  set("training.mixed_precision_param", quoted("bfloat16"));

  // The distributed optimizer shards optimizer state over dp; torchtitan's nearest is FSDP.
  number("parallelism.data_parallel_replicate_degree", plan.use_distributed_optimizer ? 1 : dp);
  number("parallelism.data_parallel_shard_degree", plan.use_distributed_optimizer ? dp : 1);
  number("parallelism.tensor_parallel_degree", plan.tensor_parallel_size);
  set("parallelism.enable_sequence_parallel", plan.sequence_parallel ? "True" : "False");
  number("parallelism.context_parallel_degree", plan.context_parallel_size);
  if (plan.context_parallel_size > 1) {
    comment("Megatron-Core's cp gives each rank a head and a tail chunk of each sequence, torchtitan's headtail");
    set("parallelism.context_parallel_load_balancer", quoted("headtail"));
  }
  if (model.moe.enabled()) number("parallelism.expert_parallel_degree", plan.expert_model_parallel_size);
  number("parallelism.pipeline_parallel_degree", plan.pipeline_parallel_size);
  if (plan.pipeline_parallel_size > 1) {
    set("parallelism.pipeline_parallel_schedule", quoted(schedule_traits(plan.schedule).torch_schedule));
    // Every microbatch of the iteration in one schedule: no accumulation steps around it.
    number("parallelism.num_pp_microbatches", plan.num_microbatches());
    // Stages of equal layers, the first and last fewer where the plan's are.
    const std::vector<int64_t> counts = stage_layer_counts(model, plan);
    const int64_t full = *std::max_element(counts.begin(), counts.end());
    const bool middle_equal =
        counts.size() < 3 || std::all_of(counts.begin() + 1, counts.end() - 1, [&](int64_t n) { return n == full; });
    number("parallelism.pipeline_parallel_layers_per_stage", full);
    number("parallelism.pipeline_parallel_first_stage_less_layers", full - counts.front());
    number("parallelism.pipeline_parallel_last_stage_less_layers", full - counts.back());
    if (!middle_equal)
      comment("torchtitan has no knob for this split's middle stages; its stages differ from megaplan's");
    comment("megaplan's exact order: megaplan schedule --kind " + to_string(plan.schedule) + " --pp " +
            std::to_string(plan.pipeline_parallel_size) + " --vpp " +
            std::to_string(plan.virtual_pipeline_parallel_size) + " --microbatches " +
            std::to_string(plan.num_microbatches()) +
            " --format csv > schedule.csv, then parallelism.pipeline_parallel_schedule_csv = \"schedule.csv\"");
  }
  switch (plan.recompute_granularity) {
    case RecomputeGranularity::kSelective: set("activation_checkpoint", "SelectiveAC.Config()"); break;
    case RecomputeGranularity::kFull: set("activation_checkpoint", "FullAC.Config()"); break;
    default: set("activation_checkpoint", "None");
  }
  text += "    return config\n";
  return text;
}

}  // namespace megaplan::planner
