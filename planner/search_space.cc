// Enumeration of legal layouts, with cheap divisibility filters first and validate_plan as the
// final word on every plan.
#include "planner/search_space.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>

#include "core/checked_math.h"
#include "core/context_parallel.h"
#include "core/error.h"
#include "core/executor_support.h"
#include "core/input_limits.h"
#include "core/kernel_list.h"
#include "core/schedule/schedule_traits.h"
#include "planner/workers.h"

namespace megaplan::planner {

namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> result;
  for (int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    result.push_back(d);
    if (d != n / d) result.push_back(n / d);
  }
  std::sort(result.begin(), result.end());
  return result;
}

bool allowed(const std::vector<int64_t>& list, int64_t value) {
  return list.empty() || std::find(list.begin(), list.end(), value) != list.end();
}

template <typename T>
std::vector<T> or_all(const std::vector<T>& list, std::vector<T> all) {
  return list.empty() ? all : list;
}

// The tensor-parallel sizes the model splits evenly (heads, query groups, MLP width) that fit the
// node (unless crossing nodes is allowed) and divide the GPUs.
bool tensor_parallel_fits(const SearchProblem& problem, int64_t tp) {
  const ModelSpec& model = problem.model;
  return model.num_attention_heads % tp == 0 && model.effective_num_query_groups() % tp == 0 &&
         model.effective_ffn_hidden_size() % tp == 0 && problem.gpus % tp == 0 &&
         (problem.space.allow_cross_node_tensor_parallel || tp <= problem.gpus_per_node);
}

std::string joined(const std::vector<int64_t>& values) {
  std::string text;
  for (int64_t value : values) text += (text.empty() ? "" : ", ") + std::to_string(value);
  return text;
}

// (tp, pp, cp) triples allowed by the lists and the model, whose product divides the GPUs.
struct Grid {
  int64_t tp, pp, cp;
};
std::vector<Grid> model_parallel_grids(const SearchProblem& problem) {
  const SearchSpace& space = problem.space;
  std::vector<Grid> grids;
  for (int64_t tp : divisors(problem.gpus)) {
    if (!allowed(space.tensor_parallel, tp) || !tensor_parallel_fits(problem, tp)) continue;
    for (int64_t pp : divisors(problem.gpus / tp)) {
      if (!allowed(space.pipeline_parallel, pp) || pp > problem.model.num_layers) continue;
      for (int64_t cp : divisors(problem.gpus / (tp * pp))) {
        if (!allowed(space.context_parallel, cp) || !cuts_into_context_chunks(problem.model.seq_length, cp)) continue;
        grids.push_back({tp, pp, cp});
      }
    }
  }
  return grids;
}

}  // namespace

void validate_search_problem(const SearchProblem& problem) {
  const SearchSpace& space = problem.space;
  const ModelSpec& model = problem.model;
  require_positive(problem.global_batch_size, "--global-batch-size");
  require_at_most(problem.global_batch_size, kMaxGlobalBatch, "--global-batch-size");
  require_at_most(problem.gpus, kMaxWorldSize, "--gpus");
  if (space.implementation == Implementation::kMegaplan) {
    if (const std::optional<SpecError> refusal = executor_model_refusal(model)) {
      throw SpecError(refusal->field(),
                      refusal->rule() +
                          ": megaplan's executor cannot train this model, so "
                          "--implementation megaplan has no plan for it (megatron-core plans Megatron-LM's run)");
    }
  }
  if (model.moe.enabled() && space.implementation != Implementation::kMegaplan) {
    ParallelPlan megatron;
    megatron.implementation = space.implementation;
    require_costed_layers(model, megatron);
  }
  for (ScheduleKind schedule : space.schedules) check_schedule_runs(space.implementation, schedule);
  for (int64_t tp : space.tensor_parallel) {
    const std::string flag = "--tensor-model-parallel-size";
    require_positive(tp, flag);
    require_divides(tp, model.num_attention_heads, flag,
                    "must divide --num-attention-heads " + std::to_string(model.num_attention_heads));
    require_divides(tp, model.effective_num_query_groups(), flag,
                    "must divide --num-query-groups " + std::to_string(model.effective_num_query_groups()));
    require_divides(tp, model.effective_ffn_hidden_size(), flag,
                    "must divide --ffn-hidden-size " + std::to_string(model.effective_ffn_hidden_size()));
    require_divides(tp, problem.gpus, flag, "must divide --gpus " + std::to_string(problem.gpus));
    if (tp > problem.gpus_per_node && !space.allow_cross_node_tensor_parallel) {
      throw SpecError(flag, std::to_string(tp) + " spans nodes of " + std::to_string(problem.gpus_per_node) +
                                " GPUs; pass --allow-cross-node-tp to search such layouts");
    }
  }
  for (int64_t pp : space.pipeline_parallel) {
    const std::string flag = "--pipeline-model-parallel-size";
    require_positive(pp, flag);
    if (pp > model.num_layers) {
      throw SpecError(flag, std::to_string(pp) + " exceeds the " + std::to_string(model.num_layers) + " layers");
    }
    require_divides(pp, problem.gpus, flag, "must divide --gpus " + std::to_string(problem.gpus));
  }
  for (int64_t cp : space.context_parallel) {
    require_positive(cp, "--context-parallel-size");
    require_context_chunks(model.seq_length, cp);
  }
  for (int64_t vpp : space.virtual_pipeline) require_positive(vpp, "--virtual-pipeline-model-parallel-size");
  for (int64_t layers : space.layers_per_virtual_stage) {
    require_positive(layers, "--num-layers-per-virtual-pipeline-stage");
  }
  for (int64_t mbs : space.micro_batch) require_positive(mbs, "--micro-batch-size");

  const std::vector<Grid> grids = model_parallel_grids(problem);
  if (grids.empty()) {
    throw SpecError("--gpus", "no tp x pp x cp among the listed sizes divides " + std::to_string(problem.gpus) +
                                  " GPUs with tp dividing the heads and pp at most the layers");
  }
  std::vector<int64_t> data_parallel_sizes;
  for (const Grid& grid : grids) {
    const int64_t dp = problem.gpus / (grid.tp * grid.pp * grid.cp);
    if (problem.global_batch_size % dp == 0) return;
    if (std::find(data_parallel_sizes.begin(), data_parallel_sizes.end(), dp) == data_parallel_sizes.end()) {
      data_parallel_sizes.push_back(dp);
    }
  }
  std::sort(data_parallel_sizes.begin(), data_parallel_sizes.end());
  throw SpecError("--global-batch-size", std::to_string(problem.global_batch_size) +
                                             " is not divisible by any data-parallel size these layouts give (" +
                                             joined(data_parallel_sizes) + ")");
}

namespace {

// A way to split the layers over pp ranks and the vpp values it allows.
struct SplitChoice {
  PipelineSplit split;
  std::vector<int64_t> virtual_pipeline;
};

// Even when pp divides the layers. Otherwise Megatron's two uneven forms: the embedding and the
// loss counted as layers, where that divides; and the first and last ranks taking what the middle
// ranks' equal shares (the layers over pp, rounded either way) leave, split between the two.
std::vector<SplitChoice> pipeline_splits(int64_t layers, int64_t pp) {
  if (layers % pp == 0) return {{PipelineSplit{}, divisors(layers / pp)}};
  std::vector<SplitChoice> choices;
  if ((layers + 2) % pp == 0) {
    SplitChoice both{PipelineSplit{.account_for_embedding = true, .account_for_loss = true}, {}};
    for (int64_t vpp : divisors((layers + 2) / pp)) {
      if ((layers + 2) / (pp * vpp) >= 2) both.virtual_pipeline.push_back(vpp);  // a layer on the end stages
    }
    choices.push_back(both);
  }
  for (const int64_t middle : {layers / pp, layers / pp + 1}) {
    const int64_t ends = layers - middle * (pp - 2);
    if (pp == 2 && middle != layers / pp) continue;  // no middle ranks: one split only
    const int64_t first = ends / 2, last = ends - first;
    if (first < 1 || last < 1) continue;
    // The same stages as counting the embedding and the loss as layers: listed once.
    if ((layers + 2) % pp == 0 && middle == (layers + 2) / pp && first == middle - 1 && last == middle - 1) continue;
    SplitChoice edges{PipelineSplit{.first_stage_layers = first, .last_stage_layers = last}, {}};
    const int64_t common = std::gcd(std::gcd(first, last), pp > 2 ? middle : first);
    edges.virtual_pipeline = divisors(common);
    choices.push_back(edges);
  }
  return choices;
}

}  // namespace

namespace {

// The candidates of one tp x pp x cp grid that validate_plan and `keep` accept, in the enumeration's
// order, and how many validate_plan accepted.
KeptPlans grid_plans(const SearchProblem& problem, const Grid& grid,
                     const std::vector<RecomputeGranularity>& recomputes, const std::vector<ScheduleKind>& schedules,
                     const std::function<bool(const ParallelPlan&)>& keep) {
  const SearchSpace& space = problem.space;
  const ModelSpec& model = problem.model;
  KeptPlans kept;
  const int64_t dp = problem.gpus / (grid.tp * grid.pp * grid.cp);
  if (problem.global_batch_size % dp != 0) return kept;
  const std::vector<bool> sequence_parallel =
      grid.tp == 1 ? std::vector<bool>{false} : or_all(space.sequence_parallel, {false, true});
  const std::vector<bool> distributed_optimizer =
      dp * grid.cp == 1 ? std::vector<bool>{false} : or_all(space.distributed_optimizer, {false, true});
  // Expert parallelism: each size dividing the experts and, with the experts' tensor-parallel
  // size, the stage's tp x cp x dp ranks (Megatron's expert groups); the experts cut over tp (0) or
  // whole (1) unless the sizes are listed.
  std::vector<std::pair<int64_t, int64_t>> experts = {{1, 0}};  // (ep, etp)
  if (model.moe.enabled()) {
    experts.clear();
    std::vector<int64_t> cuts = space.expert_tensor_parallel;
    if (cuts.empty()) cuts = grid.tp == 1 ? std::vector<int64_t>{1} : std::vector<int64_t>{grid.tp, 1};
    for (const int64_t etp : cuts) {
      for (int64_t ep : divisors(model.moe.num_experts)) {
        if ((grid.tp * grid.cp * dp) % (etp * ep) == 0 && allowed(space.expert_parallel, ep)) {
          experts.emplace_back(ep, etp == grid.tp ? 0 : etp);
        }
      }
    }
  }
  for (const auto& [ep, etp] : experts)
    for (const SplitChoice& choice : pipeline_splits(model.num_layers, grid.pp)) {
      for (int64_t vpp : choice.virtual_pipeline) {
        if (!allowed(space.virtual_pipeline, vpp) || (vpp > 1 && grid.pp == 1)) continue;
        // Listing layers per virtual stage asks for interleaving with those (even) chunk sizes.
        if (!space.layers_per_virtual_stage.empty() &&
            (vpp == 1 || !choice.split.even() ||
             !allowed(space.layers_per_virtual_stage, model.num_layers / (grid.pp * vpp)))) {
          continue;
        }
        for (int64_t mbs : divisors(problem.global_batch_size / dp)) {
          if (!allowed(space.micro_batch, mbs)) continue;
          for (RecomputeGranularity recompute : recomputes) {
            for (bool sp : sequence_parallel) {
              if (sp && (model.seq_length / grid.cp) % grid.tp != 0) continue;
              for (bool distributed : distributed_optimizer) {
                for (ScheduleKind schedule : schedules) {
                  if (grid.pp == 1 && schedule_traits(schedule).pipeline_only) continue;
                  // The schedule's rules on vpp and the microbatch count (interleaving with Megatron's
                  // default group, pp), asked here too because a refusal from validate_plan costs an
                  // exception.
                  const int64_t microbatches = problem.global_batch_size / (dp * mbs);
                  if (!schedule_shape_ok(schedule, grid.pp, vpp, microbatches, grid.pp)) continue;
                  ParallelPlan plan;
                  plan.tensor_parallel_size = grid.tp;
                  plan.pipeline_parallel_size = grid.pp;
                  plan.context_parallel_size = grid.cp;
                  plan.data_parallel_size = dp;
                  plan.virtual_pipeline_parallel_size = vpp;
                  plan.pipeline_split = choice.split;
                  plan.micro_batch_size = mbs;
                  plan.global_batch_size = problem.global_batch_size;
                  plan.sequence_parallel = sp;
                  plan.use_distributed_optimizer = distributed;
                  plan.recompute_granularity = recompute;
                  plan.schedule = schedule;
                  plan.implementation = space.implementation;
                  plan.options = space.options;
                  plan.expert_model_parallel_size = ep;
                  plan.expert_tensor_parallel_size = etp;
                  if (model.moe.enabled()) plan.moe_imbalance = space.moe_imbalance;
                  // validate_plan has the final word; MoE layers only where megaplan's executor runs them.
                  try {
                    validate_plan(model, plan);
                  } catch (const SpecError&) {
                    continue;
                  }
                  if (space.implementation == Implementation::kMegaplan && executor_moe_refusal(model, plan)) continue;
                  ++kept.legal;
                  if (!keep || keep(plan)) kept.plans.push_back(plan);
                }
              }
            }
          }
        }
      }
    }
  return kept;
}

}  // namespace

std::vector<ParallelPlan> enumerate_plans(const SearchProblem& problem, int64_t threads) {
  return enumerate_kept_plans(problem, threads, nullptr).plans;
}

KeptPlans enumerate_kept_plans(const SearchProblem& problem, int64_t threads,
                               const std::function<bool(const ParallelPlan&)>& keep) {
  const SearchSpace& space = problem.space;
  const std::vector<RecomputeGranularity> recomputes = or_all(
      space.recompute, {RecomputeGranularity::kNone, RecomputeGranularity::kSelective, RecomputeGranularity::kFull});
  // Every kind but gpipe (listed only when asked for), of those the implementation runs: Megatron-LM
  // has its own two.
  std::vector<ScheduleKind> every_schedule;
  for (const ScheduleTraits& traits : all_schedule_traits()) {
    if (traits.kind == ScheduleKind::kGPipe) continue;
    if (runs_schedule(space.implementation, traits.kind)) every_schedule.push_back(traits.kind);
  }
  const std::vector<ScheduleKind> schedules = or_all(space.schedules, every_schedule);
  // Grid by grid on the pool (validate_plan is most of the time), joined in the grids' order.
  const std::vector<Grid> grids = model_parallel_grids(problem);
  std::vector<KeptPlans> by_grid(grids.size());
  for_each_index(threads, grids.size(),
                 [&](std::size_t g) { by_grid[g] = grid_plans(problem, grids[g], recomputes, schedules, keep); });
  KeptPlans kept;
  std::size_t total = 0;
  for (const KeptPlans& grid : by_grid) total += grid.plans.size();
  kept.plans.reserve(total);
  for (const KeptPlans& grid : by_grid) {
    kept.plans.insert(kept.plans.end(), grid.plans.begin(), grid.plans.end());
    kept.legal += grid.legal;
  }
  return kept;
}

}  // namespace megaplan::planner
