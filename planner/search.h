// The search: prune every enumerated plan with the memory model, then rank what fits by estimated
// iteration time, simulating only plans whose lower bound can still beat the current k-th best.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "core/cluster_spec.h"
#include "core/model_spec.h"
#include "core/parallel_plan.h"
#include "core/step_time_estimator.h"
#include "planner/search_space.h"

namespace megaplan::planner {

struct SearchOptions {
  int64_t top = 10;              // plans to rank
  double memory_fraction = 0.9;  // of HBM a plan may fill
  int64_t threads = 0;           // 0: every hardware thread
  // The relative error the estimator's costs carry (a profile's stated uncertainty): plans
  // predicted within this fraction of the best's time are ties with it. 0: no ties marked.
  double tie_tolerance = 0;
  // Called from worker threads (never two at once) as plans are decided: (decided, total).
  std::function<void(int64_t, int64_t)> progress;
  // The problem the candidates were enumerated from: when given, the error for a search where
  // nothing fits also names the smallest GPU count that would fit (smallest_fitting_gpus).
  std::optional<SearchProblem> problem;
};

struct SearchCounts {
  int64_t enumerated = 0;
  int64_t pruned_model_state = 0;  // weights, gradients and optimizer state alone exceed the limit
  int64_t pruned_activations = 0;  // with the schedule's activations they exceed it
  int64_t pruned_by_bound = 0;     // their lower bound cannot beat the k-th best
  int64_t simulated = 0;
};

struct SearchResult {
  std::vector<RankedPlan> plans;  // best first: by iteration time, ties in enumeration order
  // Layouts that would beat #1 but whose schedule's activations take them over the memory limit:
  // of those closest to fitting, at most `top`, fastest first — what a little more memory (less
  // reserve, a smaller --memory-fraction margin) would buy. Those over the limit on model state
  // alone are not costed.
  std::vector<RankedPlan> over_memory;
  SearchCounts counts;
  int64_t memory_limit_bytes = 0;
};

// options.memory_fraction of the GPU's memory, in bytes; SpecError("--memory-fraction", ...) outside (0, 1].
int64_t memory_limit_bytes(const GpuSpec& gpu, double memory_fraction);

// What a search where nothing fits should try instead: the smallest GPU count above problem.gpus,
// doubling it (in whole nodes of problem.gpus_per_node once past one node) up to core's limit on
// GPUs (kMaxWorldSize), at which some layout of the same space and global batch fits in
// memory_fraction of `gpu`'s memory (its weights, gradients, optimizer state and its schedule's
// activations); nullopt when none does up to that limit. Counts no layout of the space divides are
// skipped. `threads` as SearchOptions::threads.
std::optional<int64_t> smallest_fitting_gpus(const SearchProblem& problem, const GpuSpec& gpu, double memory_fraction,
                                             int64_t threads);

// Ranks `candidates` (enumerate_plans' output: each passes validate_plan) for `model` on `gpu`s.
// Throws SpecError("--memory-fraction", ...) when none fits, naming the plan that comes closest and
// its shortfall (and, given options.problem, the smallest GPU count that fits). The same input gives the same plans
// whatever the thread count.
SearchResult search_plans(const ModelSpec& model, const GpuSpec& gpu, const std::vector<ParallelPlan>& candidates,
                          const StepTimeEstimator& estimator, const SearchOptions& options);

// search_plans over enumerate_plans(problem), holding only the plans whose model state fits (asked
// as the enumeration makes them, on options.threads): the same result, counts included.
SearchResult search_problem(const SearchProblem& problem, const GpuSpec& gpu, const StepTimeEstimator& estimator,
                            const SearchOptions& options);

// The most candidates compare_plans costs: it simulates each, with no pruning.
inline constexpr std::size_t kCompareLimit = 512;

// `search --compare`: every candidate costed, fitting or not, fastest first (ties in enumeration
// order), each with its peak memory; the memory limit, counts and ties as search_plans gives them
// (over_memory empty: every plan is listed). For a pinned layout the candidates are its schedules,
// vpp values and the other free dimensions. Throws SpecError("--compare", ...) beyond
// kCompareLimit candidates, naming the count.
SearchResult compare_plans(const ModelSpec& model, const GpuSpec& gpu, const std::vector<ParallelPlan>& candidates,
                           const StepTimeEstimator& estimator, const SearchOptions& options);

}  // namespace megaplan::planner
