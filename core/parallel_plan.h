// ParallelPlan: one Megatron-style layout (tp, pp, cp, dp, virtual pipeline, batch sizes,
// sequence parallelism, distributed optimizer, recomputation, pipeline schedule) and the rules
// that make it legal for a model on a given number of GPUs.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "core/implementation_options.h"
#include "core/model_spec.h"

namespace megaplan {

enum class RecomputeGranularity { kNone, kSelective, kFull };
// Megatron's --recompute-method for full recomputation: "uniform" checkpoints groups of
// --recompute-num-layers layers, "block" checkpoints each of a stage's first N layers alone.
enum class RecomputeMethod { kUniform, kBlock };
// Spellings: "gpipe", "1f1b", "interleaved", "zb-h1", "zbv", "dualpipev".
enum class ScheduleKind { kGPipe, kOneFOneB, kInterleaved, kZeroBubbleH1, kZeroBubbleV, kDualPipeV };

std::string to_string(RecomputeGranularity granularity);  // "none", "selective", "full"
std::string to_string(RecomputeMethod method);            // "uniform", "block"
RecomputeMethod parse_recompute_method(const std::string& text, const std::string& field);
std::string to_string(ScheduleKind kind);
RecomputeGranularity parse_recompute_granularity(const std::string& text, const std::string& field);
ScheduleKind parse_schedule_kind(const std::string& text, const std::string& field);

// How virtual pipeline stages map to pipeline ranks: "loop" (stage % pp, Megatron's interleaved)
// or "v" (zig-zag, two stages per rank: ZBV and DualPipeV).
enum class StagePlacement { kLoop, kV };
StagePlacement stage_placement(ScheduleKind kind);

// How the transformer layers split over pipeline ranks when not evenly (Megatron's flags). The
// first (last) pipeline rank holds `first_stage_layers` (`last_stage_layers`) layers and the other
// ranks share the rest evenly; or the input embedding (the loss) counts as one layer, so that the
// first (last) virtual stage holds one layer fewer. Each rank's layers split evenly over its
// virtual stages. core/pipeline_layout.h computes each stage's layers and checks the rules.
struct PipelineSplit {
  int64_t first_stage_layers = 0;      // --decoder-first-pipeline-num-layers; 0: not set
  int64_t last_stage_layers = 0;       // --decoder-last-pipeline-num-layers; 0: not set
  bool account_for_embedding = false;  // --account-for-embedding-in-pipeline-split
  bool account_for_loss = false;       // --account-for-loss-in-pipeline-split
  bool even() const {
    return first_stage_layers == 0 && last_stage_layers == 0 && !account_for_embedding && !account_for_loss;
  }
  bool operator==(const PipelineSplit&) const = default;
};

struct ParallelPlan {
  int64_t tensor_parallel_size = 1;
  int64_t pipeline_parallel_size = 1;
  int64_t context_parallel_size = 1;
  int64_t data_parallel_size = 1;              // derived: world / (tp * pp * cp)
  int64_t virtual_pipeline_parallel_size = 1;  // model chunks per pipeline rank
  int64_t micro_batch_size = 1;
  int64_t global_batch_size = 1;
  bool sequence_parallel = false;
  bool use_distributed_optimizer = false;
  RecomputeGranularity recompute_granularity = RecomputeGranularity::kNone;
  ScheduleKind schedule = ScheduleKind::kOneFOneB;
  RecomputeMethod recompute_method = RecomputeMethod::kUniform;  // full recomputation only
  int64_t recompute_num_layers = 1;                              // full recomputation only
  PipelineSplit pipeline_split{};                                // uneven stages
  // Whose training code runs the plan (implementation_options.h) and what that code does.
  Implementation implementation = Implementation::kMegaplan;
  ImplementationOptions options = default_implementation_options(Implementation::kMegaplan);
  // --expert-model-parallel-size: a model's experts split over ep ranks, each holding num_experts /
  // ep of every layer's. Models with experts only (core/rank_groups.h builds the expert groups).
  // Last, so that positional initialisers keep their order.
  int64_t expert_model_parallel_size = 1;
  // --expert-tensor-parallel-size: the routed experts cut over etp ranks (Megatron's expert tensor
  // parallelism); 0 is Megatron's default, tp (expert_tensor_parallel()).
  int64_t expert_tensor_parallel_size = 0;
  // --moe-imbalance: the routed load the costs assume, the busiest expert's rows over the mean (the
  // trainer logs it as tokens_per_expert_max_mean); 1, balanced. A stated input, not a choice of
  // layout: search ranks every plan at it. Models with experts only.
  double moe_imbalance = 1.0;

  int64_t world_size() const {
    return tensor_parallel_size * pipeline_parallel_size * context_parallel_size * data_parallel_size;
  }
  int64_t num_virtual_stages() const { return pipeline_parallel_size * virtual_pipeline_parallel_size; }
  // The ranks that sum each gradient, Megatron's dp-cp group: the data-parallel replicas, each of
  // whose context-parallel ranks holds a part of every sequence. The distributed optimizer shards
  // over them, and the gradient buckets are padded to their count.
  int64_t gradient_group_size() const { return data_parallel_size * context_parallel_size; }
  // The routed experts' tensor-parallel size: --expert-tensor-parallel-size, or tp.
  int64_t expert_tensor_parallel() const {
    return expert_tensor_parallel_size > 0 ? expert_tensor_parallel_size : tensor_parallel_size;
  }
  // Whether the expert layers' groups (Megatron's expert generator) differ from the dense layers':
  // under expert parallelism, or with the experts cut other than over tp.
  bool expert_groups_apart() const {
    return expert_model_parallel_size > 1 || expert_tensor_parallel() != tensor_parallel_size;
  }
  // The ranks that sum a routed expert's gradient, Megatron's expert data-parallel group: world /
  // (etp x ep x pp).
  int64_t expert_data_parallel_size() const {
    return tensor_parallel_size * gradient_group_size() / (expert_tensor_parallel() * expert_model_parallel_size);
  }
  // Microbatches per iteration on each data-parallel replica.
  int64_t num_microbatches() const { return global_batch_size / (micro_batch_size * data_parallel_size); }
};

// Megatron's --num-layers-per-virtual-pipeline-stage N: vpp = num_layers / (pp * N).
// Throws SpecError when the layers do not split that way.
int64_t virtual_pipeline_size_from_layers_per_stage(int64_t num_layers, int64_t pipeline_parallel_size,
                                                    int64_t layers_per_virtual_stage);

// dp = world / (tp * pp * cp); throws SpecError(world_flag, ...) when it does not divide
// (`world_flag`: the flag that set the world size in the command at hand, --gpus or --world-size).
int64_t derive_data_parallel_size(int64_t world_size, int64_t tensor_parallel_size, int64_t pipeline_parallel_size,
                                  int64_t context_parallel_size, const std::string& world_flag = "--gpus");

// Checks every rule that makes `plan` legal for `model` on plan.world_size() GPUs; the first
// broken rule is thrown as SpecError naming the Megatron flag and the rule with its values.
// REQUIRES: validate_model_spec(model) passed.
void validate_plan(const ModelSpec& model, const ParallelPlan& plan);
// validate_plan's rules on ep that need no layout: at least 1, 1 for a dense model, dividing the
// experts (search checks a pinned ep with it).
void validate_expert_parallel_size(const ModelSpec& model, int64_t expert_parallel_size);
// --moe-imbalance: finite, at least 1, above 1 only with experts, at most experts / top k.
void validate_moe_imbalance(const ModelSpec& model, double imbalance);

// JSON field names are the struct's member names; schedule and recompute use their spellings.
// "first 7 last 7", "embedding and loss as layers"; "" for an even split.
std::string describe_pipeline_split(const PipelineSplit& split);

// One line: "tp 8, pp 16, cp 1, dp 8, vpp 1, mbs 1, gbs 1536, recompute none, sp on, distributed
// optimizer off, 1f1b"; an uneven split follows vpp in parentheses, ep and the stated MoE
// imbalance follow dp where they are not 1.
std::string describe_plan(const ParallelPlan& plan);

nlohmann::json parallel_plan_to_json(const ParallelPlan& plan);
ParallelPlan parallel_plan_from_json(const nlohmann::json& json, const std::string& source);

}  // namespace megaplan
