#include "planner/torchtitan_config.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/pipeline_layout.h"
#include "core/schedule/schedule_traits.h"

namespace megaplan::planner {

namespace {

// torchtitan's llama3 flavours of megaplan's presets.
std::string llama3_flavour(const std::string& name) {
  if (name == "llama3-8b") return "8B";
  if (name == "llama3-70b") return "70B";
  if (name == "llama3.1-405b") return "405B";
  return "";
}

std::string quoted(const std::string& text) { return "\"" + text + "\""; }

}  // namespace

void require_torchtitan_model(const ModelSpec& model) {
  if (model.moe.enabled()) {
    throw SpecError("--emit",
                    "torchtitan's llama3 has no experts, and its MoE models' configs are not emitted yet: "
                    "use --emit megatron or launch");
  }
  if (model.qk_layernorm) {
    throw SpecError("--emit",
                    "torchtitan's llama3 has no query and key norms, and its qwen3 model's configs are not emitted "
                    "yet: use --emit megatron or launch");
  }
}

std::string torchtitan_config(const ModelSpec& model, const ParallelPlan& plan) {
  require_torchtitan_model(model);
  const auto line = [](const std::string& key, const std::string& value) { return key + " = " + value + "\n"; };
  const auto number = [&](const std::string& key, int64_t value) { return line(key, std::to_string(value)); };
  std::string text = "# torchtitan job config: " + describe_plan(plan) + " (megaplan)\n\n[model]\n";
  const std::string flavour = llama3_flavour(model.name);
  text += line("name", quoted("llama3"));
  if (!flavour.empty()) {
    text += line("flavor", quoted(flavour));
  } else {
    text += "# torchtitan has no flavour of " + model.name + ": add one to the llama3 model's flavours with dim " +
            std::to_string(model.hidden_size) + ", n_layers " + std::to_string(model.num_layers) + ", n_heads " +
            std::to_string(model.num_attention_heads) + ", n_kv_heads " +
            std::to_string(model.effective_num_query_groups()) + ", vocab_size " + std::to_string(model.vocab_size) +
            (model.swiglu ? "" : " (torchtitan's llama3 is SwiGLU and RMSNorm)") + "\n" +
            line("flavor", quoted(model.name));
  }

  const int64_t dp = plan.data_parallel_size;
  text += "\n[training]\n";
  text += number("seq_len", model.seq_length);
  text += number("global_batch_size", plan.global_batch_size);
  // A pipeline splits each data-parallel rank's batch into microbatches; without one, torchtitan
  // accumulates gradients over local batches of one microbatch.
  text +=
      number("local_batch_size", plan.pipeline_parallel_size > 1 ? plan.global_batch_size / dp : plan.micro_batch_size);
  text += line("mixed_precision_param", quoted(plan.options.precision == DType::kFloat16 ? "float16" : "bfloat16"));

  text += "\n[parallelism]\n";
  // The distributed optimizer shards optimizer state over dp; torchtitan's nearest is FSDP.
  text += number("data_parallel_replicate_degree", plan.use_distributed_optimizer ? 1 : dp);
  text += number("data_parallel_shard_degree", plan.use_distributed_optimizer ? dp : 1);
  text += number("tensor_parallel_degree", plan.tensor_parallel_size);
  text += number("context_parallel_degree", plan.context_parallel_size);
  if (plan.context_parallel_size > 1) {
    // Megatron-Core's ring, simulated here, passes each step's keys and values on beside its
    // blocks; of torchtitan's two rotations that is "alltoall" ("allgather" gathers them all first).
    text += line("context_parallel_rotate_method", quoted("alltoall"));
  }
  text += number("pipeline_parallel_degree", plan.pipeline_parallel_size);
  if (plan.pipeline_parallel_size > 1) {
    text += line("pipeline_parallel_schedule", quoted(schedule_traits(plan.schedule).torch_schedule));
    text += number("pipeline_parallel_microbatch_size", plan.micro_batch_size);
    // Stages of equal layers, the first and last fewer where the plan's are.
    const std::vector<int64_t> counts = stage_layer_counts(model, plan);
    const int64_t full = *std::max_element(counts.begin(), counts.end());
    const bool middle_equal =
        counts.size() < 3 || std::all_of(counts.begin() + 1, counts.end() - 1, [&](int64_t n) { return n == full; });
    text += number("pipeline_parallel_layers_per_stage", full);
    text += number("pipeline_parallel_first_stage_less_layers", full - counts.front());
    text += number("pipeline_parallel_last_stage_less_layers", full - counts.back());
    if (!middle_equal)
      text += "# torchtitan has no knob for this split's middle stages; its stages differ from megaplan's\n";
    text += "# megaplan's exact order: megaplan schedule --kind " + to_string(plan.schedule) + " --pp " +
            std::to_string(plan.pipeline_parallel_size) + " --vpp " +
            std::to_string(plan.virtual_pipeline_parallel_size) + " --microbatches " +
            std::to_string(plan.num_microbatches()) +
            " --format csv > schedule.csv, then pipeline_parallel_schedule_csv = \"schedule.csv\"\n";
  }

  text += "\n[activation_checkpoint]\n";
  text += line("mode", quoted(to_string(plan.recompute_granularity)));
  if (plan.recompute_granularity == RecomputeGranularity::kSelective) text += line("selective_ac_option", quoted("op"));
  return text;
}

}  // namespace megaplan::planner
