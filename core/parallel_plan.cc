// ParallelPlan spellings, derivations, validation rules and JSON mapping.
#include "core/parallel_plan.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "core/checked_math.h"
#include "core/context_parallel.h"
#include "core/input_limits.h"
#include "core/json_io.h"
#include "core/pipeline_layout.h"
#include "core/schedule/schedule_traits.h"
#include "core/units.h"

namespace megaplan {

namespace {

const std::pair<RecomputeGranularity, const char*> kRecomputeNames[] = {{RecomputeGranularity::kNone, "none"},
                                                                        {RecomputeGranularity::kSelective, "selective"},
                                                                        {RecomputeGranularity::kFull, "full"}};

const std::pair<RecomputeMethod, const char*> kRecomputeMethodNames[] = {{RecomputeMethod::kUniform, "uniform"},
                                                                         {RecomputeMethod::kBlock, "block"}};

}  // namespace

std::string to_string(RecomputeGranularity granularity) {
  for (const auto& [value, name] : kRecomputeNames) {
    if (value == granularity) return name;
  }
  return "?";
}

std::string to_string(ScheduleKind kind) { return schedule_traits(kind).spelling; }

std::string to_string(RecomputeMethod method) {
  for (const auto& [value, name] : kRecomputeMethodNames) {
    if (value == method) return name;
  }
  return "?";
}

RecomputeMethod parse_recompute_method(const std::string& text, const std::string& field) {
  for (const auto& [value, name] : kRecomputeMethodNames) {
    if (text == name) return value;
  }
  throw SpecError(field, "must be uniform or block; got \"" + text + "\"");
}

RecomputeGranularity parse_recompute_granularity(const std::string& text, const std::string& field) {
  for (const auto& [value, name] : kRecomputeNames) {
    if (text == name) return value;
  }
  throw SpecError(field, "must be one of none, selective, full; got \"" + text + "\"");
}

ScheduleKind parse_schedule_kind(const std::string& text, const std::string& field) {
  std::string spellings;
  for (const ScheduleTraits& traits : all_schedule_traits()) {
    if (text == traits.spelling) return traits.kind;
    spellings += (spellings.empty() ? "" : ", ") + std::string(traits.spelling);
  }
  throw SpecError(field, "must be one of " + spellings + "; got \"" + text + "\"");
}

StagePlacement stage_placement(ScheduleKind kind) { return schedule_traits(kind).placement; }

int64_t virtual_pipeline_size_from_layers_per_stage(int64_t num_layers, int64_t pipeline_parallel_size,
                                                    int64_t layers_per_virtual_stage) {
  require_positive(layers_per_virtual_stage, "--num-layers-per-virtual-pipeline-stage");
  require_positive(pipeline_parallel_size, "--pipeline-model-parallel-size");
  require_divides(pipeline_parallel_size, num_layers, "--num-layers",
                  "must be divisible by --pipeline-model-parallel-size " + std::to_string(pipeline_parallel_size));
  const int64_t layers_per_rank = num_layers / pipeline_parallel_size;
  require_divides(layers_per_virtual_stage, layers_per_rank, "--num-layers-per-virtual-pipeline-stage",
                  "must divide the " + std::to_string(layers_per_rank) + " layers of each pipeline rank");
  return layers_per_rank / layers_per_virtual_stage;
}

int64_t derive_data_parallel_size(int64_t world_size, int64_t tensor_parallel_size, int64_t pipeline_parallel_size,
                                  int64_t context_parallel_size, const std::string& world_flag) {
  require_positive(world_size, world_flag);
  require_positive(tensor_parallel_size, "--tensor-model-parallel-size");
  require_positive(pipeline_parallel_size, "--pipeline-model-parallel-size");
  require_positive(context_parallel_size, "--context-parallel-size");
  const int64_t model_parallel =
      checked_multiply(checked_multiply(tensor_parallel_size, pipeline_parallel_size, "--pipeline-model-parallel-size"),
                       context_parallel_size, "--context-parallel-size");
  if (world_size % model_parallel != 0) {
    throw SpecError(world_flag, "world size " + std::to_string(world_size) +
                                    " must be divisible by tp*pp*cp = " + std::to_string(tensor_parallel_size) + "*" +
                                    std::to_string(pipeline_parallel_size) + "*" +
                                    std::to_string(context_parallel_size) + " = " + std::to_string(model_parallel));
  }
  return world_size / model_parallel;
}

void validate_expert_parallel_size(const ModelSpec& model, int64_t expert_parallel_size) {
  require_positive(expert_parallel_size, "--expert-model-parallel-size");
  if (expert_parallel_size > 1 && !model.moe.enabled()) {
    throw SpecError("--expert-model-parallel-size", "needs --num-experts (a dense model has no experts to split)");
  }
  if (model.moe.enabled()) {
    require_divides(expert_parallel_size, model.moe.num_experts, "--expert-model-parallel-size",
                    [&] { return "must divide --num-experts " + std::to_string(model.moe.num_experts); });
  }
}

void validate_moe_imbalance(const ModelSpec& model, double imbalance) {
  if (!std::isfinite(imbalance) || imbalance < 1) {
    throw SpecError("--moe-imbalance", "must be at least 1 (the busiest expert's rows over the mean), got " +
                                           format_significant(imbalance, 4));
  }
  if (imbalance == 1) return;
  if (!model.moe.enabled()) throw SpecError("--moe-imbalance", "needs --num-experts (a dense model routes nothing)");
  const double most =
      static_cast<double>(model.moe.num_experts) / static_cast<double>(model.moe.effective_router_topk());
  if (imbalance > most) {
    throw SpecError("--moe-imbalance",
                    "must be at most --num-experts / --moe-router-topk = " + format_significant(most, 4) +
                        " (the busiest expert takes each token once at most), got " + format_significant(imbalance, 4));
  }
}

void validate_plan(const ModelSpec& model, const ParallelPlan& plan) {
  const int64_t tp = plan.tensor_parallel_size;
  const int64_t pp = plan.pipeline_parallel_size;
  const int64_t cp = plan.context_parallel_size;
  const int64_t dp = plan.data_parallel_size;
  const int64_t vpp = plan.virtual_pipeline_parallel_size;
  require_positive(tp, "--tensor-model-parallel-size");
  require_positive(pp, "--pipeline-model-parallel-size");
  require_positive(cp, "--context-parallel-size");
  require_positive(dp, "data_parallel_size");
  require_positive(vpp, "--virtual-pipeline-model-parallel-size");
  require_positive(plan.micro_batch_size, "--micro-batch-size");
  require_positive(plan.global_batch_size, "--global-batch-size");
  const int64_t world = checked_multiply(
      checked_multiply(checked_multiply(tp, pp, "--pipeline-model-parallel-size"), cp, "--context-parallel-size"), dp,
      "data_parallel_size");
  require_at_most(world, kMaxWorldSize, "world size (tp x pp x cp x dp)");
  require_at_most(pp, kMaxPipelineStages, "--pipeline-model-parallel-size");
  require_at_most(plan.global_batch_size, kMaxGlobalBatch, "--global-batch-size");

  // Tensor parallelism splits heads, query groups and the MLP's hidden dimension evenly.
  require_divides(tp, model.num_attention_heads, "--tensor-model-parallel-size",
                  [&] { return "must divide --num-attention-heads " + std::to_string(model.num_attention_heads); });
  require_divides(tp, model.effective_num_query_groups(), "--tensor-model-parallel-size", [&] {
    return "must divide --num-query-groups " + std::to_string(model.effective_num_query_groups());
  });
  require_divides(tp, model.effective_ffn_hidden_size(), "--tensor-model-parallel-size",
                  [&] { return "must divide --ffn-hidden-size " + std::to_string(model.effective_ffn_hidden_size()); });
  // Expert parallelism: ep ranks split each layer's experts, and the expert layers' groups (tp x ep
  // x expert-dp x pp, Megatron's expert generator) tile the same world as the dense layers'.
  const int64_t ep = plan.expert_model_parallel_size;
  validate_expert_parallel_size(model, ep);
  validate_moe_imbalance(model, plan.moe_imbalance);
  if (plan.expert_tensor_parallel_size != 0)
    require_positive(plan.expert_tensor_parallel_size, "--expert-tensor-parallel-size");
  const int64_t etp = plan.expert_tensor_parallel();
  if (!model.moe.enabled() && etp != tp) {
    throw SpecError("--expert-tensor-parallel-size", "needs --num-experts (a dense model has no experts to cut)");
  }
  if (model.moe.enabled()) {
    if (etp == tp) {
      require_divides(ep, cp * dp, "--expert-model-parallel-size", [&] {
        return "must divide the ranks of a pipeline stage outside tensor parallelism, cp x dp = " +
               std::to_string(cp * dp) + " (the expert groups tile the world as etp x ep x expert-dp x pp)";
      });
    } else {
      const int64_t stage_ranks = checked_multiply(tp, cp * dp, "--context-parallel-size");
      require_divides(
          checked_multiply(etp, ep, "--expert-model-parallel-size"), stage_ranks, "--expert-tensor-parallel-size", [&] {
            return "times --expert-model-parallel-size must divide the ranks of a pipeline stage, tp x "
                   "cp x dp = " +
                   std::to_string(stage_ranks) + " (the expert groups tile the world as etp x ep x expert-dp x pp)";
          });
    }
    // The experts' widths too, over the expert tensor-parallel size.
    require_divides(
        etp, model.effective_moe_ffn_hidden_size(),
        etp == tp ? "--tensor-model-parallel-size" : "--expert-tensor-parallel-size",
        [&] { return "must divide --moe-ffn-hidden-size " + std::to_string(model.effective_moe_ffn_hidden_size()); });
    require_divides(tp, model.moe.shared_expert_intermediate_size, "--tensor-model-parallel-size", [&] {
      return "must divide --moe-shared-expert-intermediate-size " +
             std::to_string(model.moe.shared_expert_intermediate_size);
    });
  }

  // Layers split over pipeline ranks (evenly, or as the pipeline split says), then evenly over
  // each rank's virtual stages.
  const int64_t stages = checked_multiply(pp, vpp, "--virtual-pipeline-model-parallel-size");
  require_at_most(stages, kMaxPipelineStages, "pipeline stages (pp x vpp)");
  if (vpp > 1 && pp == 1) {
    throw SpecError("--virtual-pipeline-model-parallel-size", "needs --pipeline-model-parallel-size > 1");
  }
  const int64_t stage_layers = most_stage_layers(model, plan);

  const int64_t replica_batch = checked_multiply(plan.micro_batch_size, dp, "--micro-batch-size");
  require_divides(replica_batch, plan.global_batch_size, "--global-batch-size", [&] {
    return "must be divisible by micro-batch-size*data-parallel-size = " + std::to_string(plan.micro_batch_size) + "*" +
           std::to_string(dp) + " = " + std::to_string(replica_batch);
  });
  require_at_most(plan.num_microbatches(), kMaxMicrobatches,
                  "microbatches per iteration (--global-batch-size / "
                  "(--micro-batch-size x data-parallel size))");
  require_at_most(2 * stages * plan.num_microbatches(), kMaxScheduleActions,
                  "forward and backward actions per iteration (2 x pp x vpp x microbatches)");

  if (plan.sequence_parallel) {
    if (tp == 1) throw SpecError("--sequence-parallel", "needs --tensor-model-parallel-size > 1");
    require_divides(tp, model.seq_length / cp, "--sequence-parallel", [&] {
      return "needs --seq-length/cp = " + std::to_string(model.seq_length / cp) + " divisible by tp " +
             std::to_string(tp);
    });
  }
  if (cp > 1) require_context_chunks(model.seq_length, cp);

  if (plan.recompute_granularity == RecomputeGranularity::kFull) {
    // Megatron checkpoints groups (uniform) or single layers (block) within each model chunk.
    if (plan.recompute_num_layers < 1 || plan.recompute_num_layers > stage_layers) {
      throw SpecError("--recompute-num-layers", "must be between 1 and the " + std::to_string(stage_layers) +
                                                    " layers of a model chunk, got " +
                                                    std::to_string(plan.recompute_num_layers));
    }
  }

  validate_implementation_options(plan);

  // The schedule's own rules on vpp and M; Megatron's default microbatch group per virtual stage is pp.
  check_schedule_shape(plan.schedule, pp, vpp, plan.num_microbatches(), pp, ShapeFlags::kPlan);
}

std::string describe_pipeline_split(const PipelineSplit& split) {
  std::string text;
  if (split.first_stage_layers > 0) text += " first " + std::to_string(split.first_stage_layers);
  if (split.last_stage_layers > 0) text += " last " + std::to_string(split.last_stage_layers);
  if (split.account_for_embedding || split.account_for_loss) {
    const bool both = split.account_for_embedding && split.account_for_loss;
    text += std::string(" ") + (split.account_for_embedding ? "embedding" : "") + (both ? " and " : "") +
            (split.account_for_loss ? "loss" : "") + (both ? " as layers" : " as a layer");
  }
  return text.empty() ? "" : text.substr(1);
}

std::string describe_plan(const ParallelPlan& plan) {
  return "tp " + std::to_string(plan.tensor_parallel_size) + ", pp " + std::to_string(plan.pipeline_parallel_size) +
         ", cp " + std::to_string(plan.context_parallel_size) + ", dp " + std::to_string(plan.data_parallel_size) +
         (plan.expert_model_parallel_size == 1 ? "" : ", ep " + std::to_string(plan.expert_model_parallel_size)) +
         (plan.expert_tensor_parallel() == plan.tensor_parallel_size
              ? ""
              : ", etp " + std::to_string(plan.expert_tensor_parallel())) +
         (plan.moe_imbalance == 1 ? "" : ", moe imbalance " + format_significant(plan.moe_imbalance, 4)) + ", vpp " +
         std::to_string(plan.virtual_pipeline_parallel_size) +
         (plan.pipeline_split.even() ? "" : " (" + describe_pipeline_split(plan.pipeline_split) + ")") + ", mbs " +
         std::to_string(plan.micro_batch_size) + ", gbs " + std::to_string(plan.global_batch_size) + ", recompute " +
         to_string(plan.recompute_granularity) + ", sp " + (plan.sequence_parallel ? "on" : "off") +
         ", distributed optimizer " + (plan.use_distributed_optimizer ? "on" : "off") + ", " + to_string(plan.schedule);
}

nlohmann::json parallel_plan_to_json(const ParallelPlan& plan) {
  nlohmann::json json{
      {"tensor_parallel_size", plan.tensor_parallel_size},
      {"pipeline_parallel_size", plan.pipeline_parallel_size},
      {"context_parallel_size", plan.context_parallel_size},
      {"data_parallel_size", plan.data_parallel_size},
      {"virtual_pipeline_parallel_size", plan.virtual_pipeline_parallel_size},
      {"micro_batch_size", plan.micro_batch_size},
      {"global_batch_size", plan.global_batch_size},
      {"sequence_parallel", plan.sequence_parallel},
      {"use_distributed_optimizer", plan.use_distributed_optimizer},
      {"recompute_granularity", to_string(plan.recompute_granularity)},
      {"recompute_method", to_string(plan.recompute_method)},
      {"recompute_num_layers", plan.recompute_num_layers},
      {"schedule", to_string(plan.schedule)},
      {"decoder_first_pipeline_num_layers", plan.pipeline_split.first_stage_layers},
      {"decoder_last_pipeline_num_layers", plan.pipeline_split.last_stage_layers},
      {"account_for_embedding_in_pipeline_split", plan.pipeline_split.account_for_embedding},
      {"account_for_loss_in_pipeline_split", plan.pipeline_split.account_for_loss},
      {"implementation", to_string(plan.implementation)},
      {"implementation_options", implementation_options_to_json(plan.options)},
  };
  // Only where experts are split: every dense plan's file stays as it was.
  if (plan.expert_model_parallel_size != 1) json["expert_model_parallel_size"] = plan.expert_model_parallel_size;
  if (plan.moe_imbalance != 1) json["moe_imbalance"] = plan.moe_imbalance;
  if (plan.expert_tensor_parallel() != plan.tensor_parallel_size) {
    json["expert_tensor_parallel_size"] = plan.expert_tensor_parallel_size;
  }
  return json;
}

ParallelPlan parallel_plan_from_json(const nlohmann::json& json, const std::string& source) {
  JsonFieldReader reader(json, source);
  ParallelPlan plan;
  reader.read("tensor_parallel_size", plan.tensor_parallel_size);
  reader.read("pipeline_parallel_size", plan.pipeline_parallel_size);
  reader.read("context_parallel_size", plan.context_parallel_size);
  reader.require("data_parallel_size", plan.data_parallel_size);
  reader.read("expert_model_parallel_size", plan.expert_model_parallel_size);
  reader.read("expert_tensor_parallel_size", plan.expert_tensor_parallel_size);
  reader.read("moe_imbalance", plan.moe_imbalance);
  reader.read("virtual_pipeline_parallel_size", plan.virtual_pipeline_parallel_size);
  reader.require("micro_batch_size", plan.micro_batch_size);
  reader.require("global_batch_size", plan.global_batch_size);
  reader.read("sequence_parallel", plan.sequence_parallel);
  reader.read("decoder_first_pipeline_num_layers", plan.pipeline_split.first_stage_layers);
  reader.read("decoder_last_pipeline_num_layers", plan.pipeline_split.last_stage_layers);
  reader.read("account_for_embedding_in_pipeline_split", plan.pipeline_split.account_for_embedding);
  reader.read("account_for_loss_in_pipeline_split", plan.pipeline_split.account_for_loss);
  reader.read("use_distributed_optimizer", plan.use_distributed_optimizer);
  std::string text;
  if (reader.read("recompute_granularity", text)) {
    plan.recompute_granularity = parse_recompute_granularity(text, reader.field("recompute_granularity"));
  }
  if (reader.read("recompute_method", text)) {
    plan.recompute_method = parse_recompute_method(text, reader.field("recompute_method"));
  }
  reader.read("recompute_num_layers", plan.recompute_num_layers);
  if (reader.read("schedule", text)) plan.schedule = parse_schedule_kind(text, reader.field("schedule"));
  if (reader.read("implementation", text)) {
    plan.implementation = parse_implementation(text, reader.field("implementation"));
  }
  plan.options = default_implementation_options(plan.implementation);
  if (const nlohmann::json* options = reader.read_object("implementation_options")) {
    plan.options =
        implementation_options_from_json(*options, reader.field("implementation_options"), plan.implementation);
  }
  reader.reject_unknown_keys();
  return plan;
}

}  // namespace megaplan
