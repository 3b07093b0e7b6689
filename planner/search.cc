// Branch and bound over the enumerated plans, on a pool of worker threads.
#include "planner/search.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "core/error.h"
#include "core/formulas.h"
#include "core/input_limits.h"
#include "core/memory_model.h"
#include "core/schedule/lowering.h"
#include "core/schedule/schedule.h"
#include "core/shared_by_key.h"
#include "core/units.h"
#include "planner/workers.h"

namespace megaplan::planner {

namespace {

struct Candidate {
  std::size_t index;  // into the candidates
  double bound;
};

// The plan that misses the memory limit by the least, and by how much.
struct Closest {
  int64_t shortfall = std::numeric_limits<int64_t>::max();
  std::size_t index = 0;
  int64_t pipeline_rank = 0;
  void offer(int64_t bytes_over, std::size_t candidate, int64_t rank) {
    if (bytes_over < shortfall || (bytes_over == shortfall && candidate < index)) {
      shortfall = bytes_over;
      index = candidate;
      pipeline_rank = rank;
    }
  }
};

// Each schedule shape lowered once: the memory walks and the estimator of every plan of that shape
// (tp, sequence parallelism, the distributed optimizer, recomputation, micro-batch sizes of equal
// count) read the same lowered schedule. Kept while the lowered schedules stay under
// kLoweredActionsKept actions (160 MB): a search of gpt-1t at its largest batches lowers hundreds of
// shapes of millions of actions each.
constexpr std::size_t kLoweredActionsKept = std::size_t{1} << 23;

// A plan's schedule shape: its kind, pp, vpp and microbatches, which decide its action lists.
using ShapeKey = std::tuple<ScheduleKind, int64_t, int64_t, int64_t>;
ShapeKey shape_key(const ParallelPlan& plan) {
  return {plan.schedule, plan.pipeline_parallel_size, plan.virtual_pipeline_parallel_size, plan.num_microbatches()};
}

// Each shape's lowered schedule, within kLoweredActionsKept actions.
class LoweredSchedules {
 public:
  std::shared_ptr<const PipelineSchedule> get(const ParallelPlan& plan) {
    return schedules_.get(shape_key(plan), [&] { return lower_schedule(generate_plan_schedule(plan)); });
  }

 private:
  static std::size_t actions(const PipelineSchedule& schedule) {
    std::size_t total = 0;
    for (const std::vector<Action>& rank : schedule.ranks) total += rank.size();
    return total;
  }
  SharedByKey<ShapeKey, PipelineSchedule> schedules_{kLoweredActionsKept, &LoweredSchedules::actions};
};

// megaplan's memory walks (core/executor_memory.h), one per schedule shape, recomputation and
// pipeline split: the plans of a search that share them are priced from one walk instead of walking
// their schedules again.
class MemoryWalks {
 public:
  std::shared_ptr<const ExecutorMemoryWalk> get(const ModelSpec& model, const ParallelPlan& plan,
                                                LoweredSchedules& schedules) {
    const PipelineSplit& split = plan.pipeline_split;
    const Key key{shape_key(plan), plan.recompute_granularity, plan.recompute_method, plan.recompute_num_layers,
                  std::tuple(split.first_stage_layers, split.last_stage_layers, split.account_for_embedding,
                             split.account_for_loss)};
    return walks_.get(key, [&] { return walk_executor_memory(model, plan, *schedules.get(plan)); });
  }

 private:
  // The schedule's shape, the recomputation and the layers per stage (the walk's WalkShape).
  using Key =
      std::tuple<ShapeKey, RecomputeGranularity, RecomputeMethod, int64_t, std::tuple<int64_t, int64_t, bool, bool>>;
  SharedByKey<Key, ExecutorMemoryWalk> walks_;
};

// executor_memory_floor per schedule shape, from the compute-only schedule: most plans a search
// refuses on their activations are over the limit on it already, and neither their schedules'
// lowering nor their memory walks are needed unless they are listed among the faster layouts.
class MemoryFloors {
 public:
  std::shared_ptr<const ExecutorMemoryWalk> get(const ParallelPlan& plan) {
    return floors_.get(shape_key(plan), [&] { return executor_memory_floor(generate_plan_schedule(plan)); });
  }

 private:
  SharedByKey<ShapeKey, ExecutorMemoryWalk> floors_;
};

// What a search shares among its plans.
struct SearchCaches {
  LoweredSchedules schedules;
  MemoryWalks walks;
  MemoryFloors floors;
};

// The fullest pipeline rank under core's memory model, with the plan's own schedule.
std::pair<int64_t, int64_t> peak_memory(const ModelSpec& model, const ParallelPlan& plan, SearchCaches& caches) {
  int64_t peak = 0;
  int64_t rank = 0;
  const std::vector<PipelineRankMemory> ranks =
      plan.implementation == Implementation::kMegaplan
          ? executor_pipeline_memory(model, plan, *caches.walks.get(model, plan, caches.schedules))
          : memory_per_pipeline_rank(model, plan, *caches.schedules.get(plan));
  for (const PipelineRankMemory& memory : ranks) {
    if (memory.total_bytes > peak) {
      peak = memory.total_bytes;
      rank = memory.pipeline_rank;
    }
  }
  return {peak, rank};
}

// At most peak_memory(plan).first, without lowering the plan's schedule (megaplan's implementation;
// 0 for Megatron's, whose memory model needs no walk).
int64_t memory_floor(const ModelSpec& model, const ParallelPlan& plan, SearchCaches& caches) {
  if (plan.implementation != Implementation::kMegaplan) return 0;
  int64_t floor = 0;
  for (const PipelineRankMemory& memory : executor_pipeline_memory(model, plan, *caches.floors.get(plan))) {
    floor = std::max(floor, memory.total_bytes);
  }
  return floor;
}

// The fullest pipeline rank's weights, gradients, optimizer state and reserve, and its index (the
// first of equals). A rank's model state grows with its parameters (two bytes of weight each at
// least), so the fullest rank is the one holding the most.
std::pair<int64_t, int64_t> model_state_peak(const ParallelPlan& plan, const ParametersPerGpuCache& parameters) {
  const std::vector<int64_t>& per_rank = parameters.per_pipeline_rank(plan);
  const auto most = std::max_element(per_rank.begin(), per_rank.end());
  return {model_state_bytes(plan, *most).total(), static_cast<int64_t>(most - per_rank.begin())};
}

// How many layouts refused on memory the search costs to find those that would beat #1.
constexpr std::size_t kOverMemoryTries = 64;

// The shared state of one search: the k best so far and the counts, behind one mutex.
class Ranking {
 public:
  Ranking(std::size_t top, std::size_t total, const SearchOptions& options)
      : top_(top), total_(total), options_(options) {}

  // False when `bound` cannot beat the k-th best any more.
  bool may_beat(double bound) {
    const std::lock_guard<std::mutex> lock(mutex_);
    return best_.size() < top_ || bound <= best_.back().plan.estimate.iteration_time_s;
  }
  void add(RankedPlan plan, std::size_t index) {
    const std::lock_guard<std::mutex> lock(mutex_);
    ++simulated_;
    const auto order = [](const Entry& a, const Entry& b) {
      const double ta = a.plan.estimate.iteration_time_s;
      const double tb = b.plan.estimate.iteration_time_s;
      return ta != tb ? ta < tb : a.index < b.index;
    };
    Entry entry{std::move(plan), index};
    best_.insert(std::upper_bound(best_.begin(), best_.end(), entry, order), std::move(entry));
    if (best_.size() > top_) best_.pop_back();
    decided_locked();
  }
  void too_big(int64_t shortfall, std::size_t index, int64_t rank, double bound, int64_t peak) {
    const std::lock_guard<std::mutex> lock(mutex_);
    ++pruned_activations_;
    over_memory_.push_back({bound, index, peak, true});
    closest_.offer(shortfall, index, rank);
    decided_locked();
  }
  // Over the limit on its memory floor: its peak (at least `floor`) is not walked yet.
  void too_big_on_floor(std::size_t index, double bound, int64_t floor) {
    const std::lock_guard<std::mutex> lock(mutex_);
    ++pruned_activations_;
    over_memory_.push_back({bound, index, floor, false});
    decided_locked();
  }

  std::vector<RankedPlan> plans() const {
    std::vector<RankedPlan> plans;
    for (const Entry& entry : best_) plans.push_back(entry.plan);
    return plans;
  }
  int64_t simulated() const { return simulated_; }
  int64_t pruned_activations() const { return pruned_activations_; }
  const Closest& closest() const { return closest_; }
  // Every candidate refused on its activations: its bound, index and peak memory (or, where the
  // peak is not walked, its floor).
  struct OverMemory {
    double bound;
    std::size_t index;
    int64_t peak;
    bool walked;
  };
  const std::vector<OverMemory>& over_memory() const { return over_memory_; }

 private:
  struct Entry {
    RankedPlan plan;
    std::size_t index;
  };
  void decided_locked() {
    ++decided_;
    if (options_.progress) options_.progress(decided_, static_cast<int64_t>(total_));
  }

  std::mutex mutex_;
  const std::size_t top_;
  const std::size_t total_;
  const SearchOptions& options_;
  std::vector<Entry> best_;  // sorted, at most top_
  int64_t simulated_ = 0;
  int64_t pruned_activations_ = 0;
  int64_t decided_ = 0;
  Closest closest_;
  std::vector<OverMemory> over_memory_;
};

// Layouts refused on their activations, closest to fitting first: by peak, then index. A peak known
// only by its floor is walked when the floor comes up (at an equal number before a walked peak, so
// that equal peaks still go by index); the rest are never walked. A floor is at most its walked
// peak, so walking one never changes the order of those before it.
class ClosestToFitting {
 public:
  ClosestToFitting(std::vector<Ranking::OverMemory> entries, std::function<int64_t(std::size_t)> walk_peak)
      : heap_(std::move(entries)), walk_peak_(std::move(walk_peak)) {
    std::make_heap(heap_.begin(), heap_.end(), later);
  }
  // REQUIRES: called at most once per entry.
  Ranking::OverMemory next() {
    for (;;) {
      std::pop_heap(heap_.begin(), heap_.end(), later);
      Ranking::OverMemory& closest = heap_.back();
      if (closest.walked) {
        const Ranking::OverMemory found = closest;
        heap_.pop_back();
        return found;
      }
      closest.peak = walk_peak_(closest.index);
      closest.walked = true;
      std::push_heap(heap_.begin(), heap_.end(), later);
    }
  }

 private:
  static bool later(const Ranking::OverMemory& a, const Ranking::OverMemory& b) {
    return std::tuple(a.peak, a.walked, a.index) > std::tuple(b.peak, b.walked, b.index);
  }
  std::vector<Ranking::OverMemory> heap_;
  std::function<int64_t(std::size_t)> walk_peak_;
};

}  // namespace

std::optional<int64_t> smallest_fitting_gpus(const SearchProblem& problem, const GpuSpec& gpu, double memory_fraction,
                                             int64_t threads) {
  const int64_t limit = memory_limit_bytes(gpu, memory_fraction);
  const int64_t per_node = std::max<int64_t>(1, problem.gpus_per_node);
  const int64_t workers = worker_count(threads);
  const ParametersPerGpuCache parameters(problem.model);
  SearchCaches caches;
  const auto doubled = [per_node](int64_t gpus) {
    const int64_t next = 2 * gpus;
    return next <= per_node ? next : (next + per_node - 1) / per_node * per_node;  // whole nodes past one
  };
  for (int64_t gpus = doubled(problem.gpus); gpus <= kMaxWorldSize.most; gpus = doubled(gpus)) {
    SearchProblem wider = problem;
    wider.gpus = gpus;
    std::vector<ParallelPlan> candidates;  // those whose model state fits
    try {
      validate_search_problem(wider);
      candidates = enumerate_kept_plans(wider, workers, [&](const ParallelPlan& plan) {
                     return model_state_peak(plan, parameters).first <= limit;
                   }).plans;
    } catch (const SpecError&) {
      continue;  // no layout of the space on this many GPUs (pins, the global batch)
    }
    // Least model state first: the likeliest to fit with their activations.
    std::vector<std::pair<int64_t, std::size_t>> by_state;
    for (std::size_t index = 0; index < candidates.size(); ++index) {
      by_state.emplace_back(model_state_peak(candidates[index], parameters).first, index);
    }
    std::sort(by_state.begin(), by_state.end());
    std::atomic<bool> fits{false};
    std::atomic<std::size_t> next{0};
    run_workers(workers, [&](std::atomic<bool>& stop) {
      while (!stop.load() && !fits.load()) {
        const std::size_t at = next.fetch_add(1);
        if (at >= by_state.size()) return;
        if (peak_memory(problem.model, candidates[by_state[at].second], caches).first <= limit) fits.store(true);
      }
    });
    if (fits.load()) return gpus;
  }
  return std::nullopt;
}

int64_t memory_limit_bytes(const GpuSpec& gpu, double memory_fraction) {
  if (!(memory_fraction > 0 && memory_fraction <= 1)) {
    throw SpecError("--memory-fraction", "must lie in (0, 1], got " + std::to_string(memory_fraction));
  }
  return static_cast<int64_t>(std::floor(memory_fraction * static_cast<double>(gpu.hbm_capacity_bytes)));
}

namespace {

// search_plans, but where nothing fits: with `explain`, the error naming the closest plan; without,
// a result with no plans.
SearchResult rank_plans(const ModelSpec& model, const GpuSpec& gpu, const std::vector<ParallelPlan>& candidates,
                        const StepTimeEstimator& estimator, const SearchOptions& options, bool explain) {
  if (options.top < 1) throw SpecError("--top", "must be at least 1, got " + std::to_string(options.top));
  SearchResult result;
  result.memory_limit_bytes = memory_limit_bytes(gpu, options.memory_fraction);
  const int64_t limit = result.memory_limit_bytes;
  result.counts.enumerated = static_cast<int64_t>(candidates.size());

  // Model state first: no schedule needed. Then order what is left by its lower bound, so that the
  // likely winners are simulated first and the k-th best soon rules out the rest.
  const ParametersPerGpuCache parameters(model);
  SearchCaches caches;
  std::vector<Candidate> survivors;
  for (std::size_t index = 0; index < candidates.size(); ++index) {
    if (model_state_peak(candidates[index], parameters).first > limit) {
      ++result.counts.pruned_model_state;
      continue;
    }
    survivors.push_back({index, 0});
  }
  const int64_t threads = worker_count(options.threads);
  // The bounds on the threads: a bound costs its plan's layers the first time they are met.
  for_each_index(threads, survivors.size(),
                 [&](std::size_t i) { survivors[i].bound = estimator.lower_bound_s(candidates[survivors[i].index]); });
  std::sort(survivors.begin(), survivors.end(), [](const Candidate& a, const Candidate& b) {
    return a.bound != b.bound ? a.bound < b.bound : a.index < b.index;
  });

  Ranking ranking(static_cast<std::size_t>(options.top), survivors.size(), options);
  std::atomic<std::size_t> next{0};
  // A bound that fails stops every thread: every later candidate's bound fails too.
  run_workers(threads, [&](std::atomic<bool>& stop) {
    while (!stop.load()) {
      const std::size_t at = next.fetch_add(1);
      if (at >= survivors.size()) return;
      const Candidate& candidate = survivors[at];
      if (!ranking.may_beat(candidate.bound)) {
        stop.store(true);
        return;
      }
      const ParallelPlan& plan = candidates[candidate.index];
      if (const int64_t floor = memory_floor(model, plan, caches); floor > limit) {
        ranking.too_big_on_floor(candidate.index, candidate.bound, floor);
        continue;
      }
      const auto [peak, rank] = peak_memory(model, plan, caches);
      if (peak > limit) {
        ranking.too_big(peak - limit, candidate.index, rank, candidate.bound, peak);
        continue;
      }
      ranking.add({plan, estimator.estimate(plan, *caches.schedules.get(plan)), peak, candidate.bound},
                  candidate.index);
    }
  });

  result.plans = ranking.plans();
  if (options.tie_tolerance > 0 && !result.plans.empty()) {
    const double best = result.plans.front().estimate.iteration_time_s;
    for (std::size_t i = 1; i < result.plans.size(); ++i) {
      result.plans[i].tie = result.plans[i].estimate.iteration_time_s <= best * (1 + options.tie_tolerance);
    }
  }
  // Faster layouts refused on memory: every candidate whose bound is below #1's time was decided
  // (no k-th best can rule it out), so these do not depend on the thread count.
  if (!result.plans.empty()) {
    const double best = result.plans.front().estimate.iteration_time_s;
    std::vector<Ranking::OverMemory> faster;
    for (const Ranking::OverMemory& entry : ranking.over_memory()) {
      if (entry.bound < best) faster.push_back(entry);
    }
    // Those closest to fitting first (the actionable ones), at most kOverMemoryTries estimates, taken
    // in that order by the threads until the estimates done hold `top` faster than #1. A thread may
    // have taken one more by then, so the list is the first `top` faster ones in that order: the
    // same list whatever the thread count.
    const std::size_t tries = std::min(faster.size(), kOverMemoryTries);
    const auto top = static_cast<std::size_t>(options.top);
    ClosestToFitting closest_first(
        std::move(faster), [&](std::size_t index) { return peak_memory(model, candidates[index], caches).first; });
    std::mutex taking;
    std::vector<RankedPlan> tried(tries);
    std::vector<bool> beats(tries, false);
    std::size_t taken = 0;
    std::size_t found = 0;
    run_workers(threads, [&](std::atomic<bool>& stop) {
      for (;;) {
        std::size_t at = 0;
        Ranking::OverMemory entry{};
        {
          const std::lock_guard<std::mutex> lock(taking);
          if (stop.load() || taken == tries || found >= top) return;
          entry = closest_first.next();
          at = taken++;
        }
        const ParallelPlan& plan = candidates[entry.index];
        RankedPlan ranked{plan, estimator.estimate(plan, *caches.schedules.get(plan)), entry.peak, entry.bound};
        const std::lock_guard<std::mutex> lock(taking);
        beats[at] = ranked.estimate.iteration_time_s < best;
        found += beats[at] ? 1 : 0;
        tried[at] = std::move(ranked);
      }
    });
    for (std::size_t at = 0; at < taken && result.over_memory.size() < top; ++at) {
      if (beats[at]) result.over_memory.push_back(std::move(tried[at]));
    }
    std::stable_sort(result.over_memory.begin(), result.over_memory.end(),
                     [](const RankedPlan& a, const RankedPlan& b) {
                       return a.estimate.iteration_time_s < b.estimate.iteration_time_s;
                     });
  }
  result.counts.simulated = ranking.simulated();
  result.counts.pruned_activations = ranking.pruned_activations();
  result.counts.pruned_by_bound =
      static_cast<int64_t>(survivors.size()) - result.counts.simulated - result.counts.pruned_activations;
  if (!result.plans.empty() || !explain) return result;
  if (candidates.empty()) throw SpecError("search", "no legal layout matches the listed sizes");

  // Nothing fits. Name the smallest shortfall under the full model: a plan pruned on model state
  // alone falls short by at least that much, so only those that could still come closer are costed.
  Closest closest = ranking.closest();
  for (const Ranking::OverMemory& entry : ranking.over_memory()) {
    // A floor already short by more than the closest cannot come closer.
    if (entry.walked || entry.peak - limit > closest.shortfall) continue;
    const auto [peak, rank] = peak_memory(model, candidates[entry.index], caches);
    closest.offer(peak - limit, entry.index, rank);
  }
  std::vector<std::pair<int64_t, std::size_t>> by_state;
  for (std::size_t index = 0; index < candidates.size(); ++index) {
    const int64_t state = model_state_peak(candidates[index], parameters).first;
    if (state > limit) by_state.emplace_back(state - limit, index);
  }
  std::sort(by_state.begin(), by_state.end());
  for (const auto& [state_shortfall, index] : by_state) {
    if (state_shortfall > closest.shortfall) break;
    const auto [peak, rank] = peak_memory(model, candidates[index], caches);
    closest.offer(peak - limit, index, rank);
  }
  const ParallelPlan& plan = candidates[closest.index];
  std::string more_gpus;
  if (options.problem) {
    const int64_t per_node = options.problem->gpus_per_node;
    const std::string nodes = "doubling whole nodes of " + std::to_string(per_node) + " GPUs";
    const std::optional<int64_t> fitting =
        smallest_fitting_gpus(*options.problem, gpu, options.memory_fraction, threads);
    more_gpus = fitting
                    ? "; the smallest GPU count where a layout fits is " + std::to_string(*fitting) + " (" + nodes + ")"
                    : "; nor does any on up to " + std::to_string(kMaxWorldSize.most) + " GPUs (" + nodes + ")";
  }
  throw SpecError("--memory-fraction",
                  "no layout fits in " + format_gib(static_cast<double>(limit)) + " per GPU (" +
                      std::to_string(static_cast<int>(std::lround(100 * options.memory_fraction))) + "% of " +
                      format_gib(static_cast<double>(gpu.hbm_capacity_bytes)) + "); the closest, " +
                      describe_plan(plan) + ", needs " + format_gib(static_cast<double>(limit + closest.shortfall)) +
                      " on pipeline rank " + std::to_string(closest.pipeline_rank) + ": " +
                      format_gib(static_cast<double>(closest.shortfall)) + " more" + more_gpus);
}

}  // namespace

SearchResult search_plans(const ModelSpec& model, const GpuSpec& gpu, const std::vector<ParallelPlan>& candidates,
                          const StepTimeEstimator& estimator, const SearchOptions& options) {
  return rank_plans(model, gpu, candidates, estimator, options, /*explain=*/true);
}

SearchResult search_problem(const SearchProblem& problem, const GpuSpec& gpu, const StepTimeEstimator& estimator,
                            const SearchOptions& options) {
  const int64_t limit = memory_limit_bytes(gpu, options.memory_fraction);
  const int64_t threads = worker_count(options.threads);
  const ParametersPerGpuCache parameters(problem.model);
  const KeptPlans fitting = enumerate_kept_plans(
      problem, threads, [&](const ParallelPlan& plan) { return model_state_peak(plan, parameters).first <= limit; });
  SearchResult result = rank_plans(problem.model, gpu, fitting.plans, estimator, options, /*explain=*/false);
  // Nothing fits: the closest plan may be one over the limit on model state, so every plan is asked.
  if (result.plans.empty())
    return search_plans(problem.model, gpu, enumerate_plans(problem, threads), estimator, options);
  result.counts.enumerated = fitting.legal;
  result.counts.pruned_model_state = fitting.legal - static_cast<int64_t>(fitting.plans.size());
  return result;
}

SearchResult compare_plans(const ModelSpec& model, const GpuSpec& gpu, const std::vector<ParallelPlan>& candidates,
                           const StepTimeEstimator& estimator, const SearchOptions& options) {
  if (candidates.empty()) throw SpecError("--compare", "no legal layout matches the listed sizes");
  if (candidates.size() > kCompareLimit) {
    throw SpecError("--compare", std::to_string(candidates.size()) +
                                     " layouts match; pin the layout (--tp, --pp, --cp, "
                                     "--mbs, ...) to compare at most " +
                                     std::to_string(kCompareLimit));
  }
  SearchResult result;
  result.memory_limit_bytes = memory_limit_bytes(gpu, options.memory_fraction);
  result.counts.enumerated = result.counts.simulated = static_cast<int64_t>(candidates.size());
  SearchCaches caches;
  for (const ParallelPlan& plan : candidates) {
    result.plans.push_back({plan, estimator.estimate(plan, *caches.schedules.get(plan)),
                            peak_memory(model, plan, caches).first, estimator.lower_bound_s(plan)});
  }
  // Fastest first, ties in enumeration order.
  std::stable_sort(result.plans.begin(), result.plans.end(), [](const RankedPlan& a, const RankedPlan& b) {
    return a.estimate.iteration_time_s < b.estimate.iteration_time_s;
  });
  const double best = result.plans.front().estimate.iteration_time_s;
  for (std::size_t i = 1; i < result.plans.size(); ++i) {
    result.plans[i].tie =
        options.tie_tolerance > 0 && result.plans[i].estimate.iteration_time_s <= best * (1 + options.tie_tolerance);
  }
  return result;
}

}  // namespace megaplan::planner
