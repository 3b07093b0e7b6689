// The executor's allocations, walked through each rank's action list (see executor_memory.h).
#include "core/executor_memory.h"

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "core/formulas.h"
#include "core/hot_loop.h"
#include "core/kernel_list.h"
#include "core/parameter_list.h"
#include "core/pipeline_layout.h"
#include "core/schedule/lowering.h"

namespace megaplan {

namespace {

constexpr int64_t kFloat = 4;

// What the walk reads of a plan: each chunk's recomputation groups (chunks of uneven stages
// differ), and the first and the last stage by their ends.
struct WalkShape {
  bool forward_borrows = false;                     // a layer keeps less than everything: F runs it on a lent set
  std::vector<std::vector<int64_t>> group_borrows;  // per stage: sets each group borrows in the backward
  int64_t last_stage = 0;
};

WalkShape walk_shape(const ModelSpec& model, const ParallelPlan& plan) {
  WalkShape shape;
  const bool selective = plan.recompute_granularity == RecomputeGranularity::kSelective;
  for (const int64_t layers : stage_layer_counts(model, plan)) {
    const std::vector<LayerGroup> groups = recompute_groups(plan, layers);
    for (const LayerKeep keep : layer_keeps(plan, groups))
      shape.forward_borrows = shape.forward_borrows || keep != LayerKeep::kAll;
    std::vector<int64_t>& borrows = shape.group_borrows.emplace_back();
    for (const LayerGroup& group : groups) borrows.push_back(group.recomputed || selective ? group.num_layers : 0);
  }
  shape.last_stage = plan.num_virtual_stages() - 1;
  return shape;
}

// One chunk's buffer sizes, in bytes.
struct ChunkBytes {
  int64_t master = 0, gradients = 0, compute = 0, moments = 0, scratch = 0;
  int64_t microbatch = 0;  // one in-flight set
  int64_t layer = 0;       // one whole-layer set of the recomputation pool
  int64_t deferred = 0;    // I's kept output gradients (and the embedding's input gradient) until W
  int64_t message = 0;     // one activation or gradient message
};

ChunkBytes chunk_bytes(const ModelSpec& model, const ParallelPlan& plan, int64_t stage,
                       const ExecutorPrecision& precision, int64_t bucket_size) {
  const int64_t a = precision.activation_bytes;
  const LayerRecipe recipe(model, plan, precision);
  const LayerDims& dims = recipe.dims;
  const StageLayers layers = stage_layers(stage, model, plan);

  ChunkBytes bytes;
  bytes.message = a * dims.rows * dims.hidden;
  const int64_t parameters = stage_parameters(model, plan, stage).parameters_per_gpu;
  const ParameterLayout layout = stage_layout(model, plan, stage, static_cast<std::size_t>(bucket_size));
  const auto buffer = static_cast<int64_t>(layout.total);
  bytes.master = kFloat * buffer;
  bytes.gradients = kFloat * buffer;
  bytes.compute = a == kFloat ? 0 : a * parameters;
  if (plan.use_distributed_optimizer) {
    // Sharded over dp x cp, Megatron's data-parallel group with context parallelism; the routed
    // experts' buckets over the expert data-parallel group.
    int64_t shard = 0;
    for (const GradientBucket& bucket : layout.buckets) {
      const int64_t replicas = bucket.expert ? plan.expert_data_parallel_size() : plan.gradient_group_size();
      shard += static_cast<int64_t>(bucket.shard_size(replicas));
    }
    bytes.moments = 2 * kFloat * shard;
  } else {
    bytes.moments = 2 * kFloat * buffer;
  }
  bytes.scratch = buffer_bytes(recipe.scratch(layers.has_output_layer), a);
  bytes.microbatch = buffer_bytes(recipe.microbatch(layers.has_output_layer), a);
  const std::vector<LayerKeep> keeps = layer_keeps(plan, recompute_groups(plan, layers.num_layers));
  const auto moe_buffers = [&] {
    return buffer_bytes(moe_kept(*recipe.moe), a) + buffer_bytes(moe_expert_kept(*recipe.moe), a);
  };
  bytes.layer = buffer_bytes(recipe.kept(LayerKeep::kAll), a) +
                (lent_sets_hold_moe(model, layers.first_layer, keeps) ? moe_buffers() : 0);
  for (std::size_t l = 0; l < keeps.size(); ++l) {
    const bool moe = model.moe.moe_layer(layers.first_layer + static_cast<int64_t>(l));
    bytes.microbatch += buffer_bytes(recipe.kept(keeps[l], moe), a);
    if (moe && keeps_moe_buffers(keeps[l])) bytes.microbatch += moe_buffers();
  }
  // One MoE MLP's scratch on a chunk with MoE layers (executor/model/moe_mlp.h), and with
  // --moe-router-enable-expert-bias each MoE layer's expert bias and its counts (fp32).
  if (const int64_t moe_layers = model.moe.moe_layers(layers.first_layer, layers.num_layers); moe_layers > 0) {
    bytes.scratch += buffer_bytes(moe_scratch(*recipe.moe), a) + buffer_bytes(moe_expert_scratch(*recipe.moe), a);
    if (model.moe.router_enable_expert_bias) bytes.scratch += 2 * kFloat * moe_layers * model.moe.num_experts;
  }
  bytes.deferred = layers.has_embedding ? a * recipe.deferred_embedding_gradient().count : 0;
  for (int64_t l = 0; l < layers.num_layers; ++l) {
    const bool moe = model.moe.moe_layer(layers.first_layer + l);
    bytes.deferred += buffer_bytes(recipe.deferred(moe), a) + (moe ? buffer_bytes(moe_deferred(*recipe.moe), a) : 0);
  }
  return bytes;
}

// One pipeline rank's walk in counts: high-water marks of what is pooled (microbatch sets and lent
// layer sets per chunk, gradient messages) and I's deferred gradients per chunk, recorded at every
// moment one of them grows; pricing takes the largest sum. State is indexed by (the rank's chunk,
// microbatch) in flat vectors: the planner walks thousands of schedules of thousands of microbatches.
// Without kMessages it counts no messages (the memory floor's walk of a compute-only order).
template <bool kMessages>
class RankWalk {
 public:
  // `stages`: this rank's, in increasing order.
  RankWalk(const WalkShape& walk, const ScheduleShape& shape, const std::vector<int64_t>& stages)
      : walk_(walk),
        shape_(shape),
        microbatches_(shape.microbatches),
        local_(static_cast<std::size_t>(shape.num_stages), -1) {
    for (const int64_t stage : stages) local_[static_cast<std::size_t>(stage)] = locals_++;
    const auto cells = static_cast<std::size_t>(locals_ * microbatches_);
    kept_.assign(cells, 0);
    if (kMessages) {
      message_.assign(3 * cells, 0);  // gradients (gradient_cell), then received inputs (input_cell)
      sent_.assign(2 * cells, 0);
    }
    for (auto* counts : {&live_sets_, &lent_}) counts->assign(static_cast<std::size_t>(locals_), 0);
    counts_.assign(static_cast<std::size_t>(3 * locals_ + 1), 0);
    note();
  }

  // Flattened: a search walks millions of actions, a few instructions each once inlined.
  MEGAPLAN_HOT_LOOP void run(const std::vector<Action>& actions) {
    for (const Action& action : actions) run(action);
  }

  void run(const Action& action) {
    switch (action.kind) {
      case ActionKind::kForward: forward(action.stage, action.microbatch); break;
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput:
        backward(action.stage, action.microbatch, action.kind == ActionKind::kBackwardInput);
        break;
      case ActionKind::kBackwardWeight: weight(action.stage, action.microbatch); break;
      case ActionKind::kOverlapForwardBackward: {
        const ActionParts parts = parts_of(action);
        // The interpreter issues a pair of two chunks backward first (Backend::run_pair's order).
        const bool one_chunk = parts.parts[0].stage == parts.parts[1].stage;
        run(parts.parts[one_chunk ? 0 : 1]);
        run(parts.parts[one_chunk ? 1 : 0]);
        break;
      }
      case ActionKind::kRecvForward: take_message(input_cell(action.stage, action.microbatch)); break;
      case ActionKind::kRecvBackward:
        take_message(gradient_cell(action.stage + 1, action.microbatch));  // the gradient of stage s's output
        break;
      case ActionKind::kSendBackward:
        if constexpr (kMessages) sent_[gradient_cell(action.stage, action.microbatch)] = 1;
        break;
      case ActionKind::kOptimizer:
        for (std::size_t c = 0; c < sent_.size(); ++c) {
          if (sent_[c]) give_message(c);
          sent_[c] = 0;
        }
        break;
      case ActionKind::kSendForward:
      case ActionKind::kReduceGrad: break;
    }
  }

  // Evaluation's two message buffers, after the iteration.
  void evaluate() {
    counts_.back() += 2;
    note();
    keep_noted();
    counts_.back() -= 2;
  }

  // REQUIRES: called once, after the last action.
  ExecutorMemoryWalk::Rank result() {
    keep_noted();
    ExecutorMemoryWalk::Rank rank;
    for (std::size_t stage = 0; stage < local_.size(); ++stage) {
      if (local_[stage] >= 0) rank.stages.push_back(static_cast<int64_t>(stage));
    }
    // High-water counts only grow, so a moment is dominated by any later one whose deferred counts
    // are no smaller: pricing needs only the rest (without I/W, the last moment alone).
    const std::size_t width = counts_.size();
    for (std::size_t end = moments_.size(); end > 0; end -= width) {
      const auto moment = moments_.begin() + static_cast<std::ptrdiff_t>(end - width);
      const bool dominated =
          std::any_of(rank.moments.begin(), rank.moments.end(), [&](const std::vector<int64_t>& later) {
            for (std::size_t at = 2; at + 1 < width; at += 3) {
              if (later[at] < moment[static_cast<std::ptrdiff_t>(at)]) return false;
            }
            return true;
          });
      if (!dominated) rank.moments.emplace_back(moment, moment + static_cast<std::ptrdiff_t>(width));
    }
    for (int64_t i = 0; i < locals_; ++i) rank.most_inflight += counts_[static_cast<std::size_t>(3 * i)];
    return rank;
  }

 private:
  std::size_t index(int64_t stage) const { return static_cast<std::size_t>(local_[static_cast<std::size_t>(stage)]); }
  std::size_t cell(int64_t stage, int64_t microbatch) const {
    return index(stage) * static_cast<std::size_t>(microbatches_) + static_cast<std::size_t>(microbatch);
  }
  // The gradient at stage s's input: written by this rank's stage s, or received for (or handed
  // over to) this rank's stage s - 1 as the gradient of its output.
  std::size_t gradient_cell(int64_t stage, int64_t microbatch) const {
    const bool here = stage < shape_.num_stages && local_[static_cast<std::size_t>(stage)] >= 0;
    return 2 * cell(here ? stage : stage - 1, microbatch) + (here ? 0 : 1);
  }
  // A received input of stage s, until its F copies it into the microbatch's set.
  std::size_t input_cell(int64_t stage, int64_t microbatch) const {
    return static_cast<std::size_t>(2 * locals_ * microbatches_) + cell(stage, microbatch);
  }
  int64_t& sets(int64_t stage) { return counts_[3 * index(stage)]; }
  int64_t& lent_peak(int64_t stage) { return counts_[3 * index(stage) + 1]; }
  int64_t& deferred(int64_t stage) { return counts_[3 * index(stage) + 2]; }

  // A microbatch's set on `stage`: taken at its F.
  void hold(int64_t stage) {
    if (++live_sets_[index(stage)] > sets(stage)) {
      sets(stage) = live_sets_[index(stage)];
      note();
    }
  }
  void drop(int64_t stage) { --live_sets_[index(stage)]; }
  void borrow(int64_t stage, int64_t count) {
    int64_t& lent = lent_[index(stage)];
    lent += count;
    if (lent > lent_peak(stage)) {
      lent_peak(stage) = lent;
      note();
    }
  }
  void give_back(int64_t stage, int64_t count) { lent_[index(stage)] -= count; }
  // Message buffers, keyed by gradient_cell.
  void take_message(std::size_t c) {
    if constexpr (!kMessages) return;
    message_[c] = 1;
    if (++messages_live_ > counts_.back()) {
      counts_.back() = messages_live_;
      note();
    }
  }
  void give_message(std::size_t c) {
    if constexpr (!kMessages) return;
    if (!message_[c]) return;
    message_[c] = 0;
    --messages_live_;
  }

  void forward(int64_t stage, int64_t microbatch) {
    hold(stage);
    give_message(input_cell(stage, microbatch));  // copied in: the set is taken before it goes back
    if (walk_.forward_borrows) {
      borrow(stage, 1);
      give_back(stage, 1);
    }
  }

  void backward(int64_t stage, int64_t microbatch, bool defer) {
    const bool first = stage == 0, last = stage == walk_.last_stage;
    // The gradient of the stage's output: received (RECV_B), or handed over by the next stage on
    // this rank; a compute-only schedule has neither, so it arrives now.
    const std::size_t output_gradient = gradient_cell(stage + 1, microbatch);
    if (kMessages && !last && !message_[output_gradient]) take_message(output_gradient);
    if (!first) take_message(gradient_cell(stage, microbatch));  // the input gradient this backward writes
    int64_t kept = 0;
    const std::vector<int64_t>& borrows = walk_.group_borrows[static_cast<std::size_t>(stage)];
    for (auto g = borrows.size(); g-- > 0;) {
      borrow(stage, borrows[g]);
      if (defer) {
        kept += borrows[g];
      } else {
        give_back(stage, borrows[g]);
      }
    }
    if (defer) {
      ++deferred(stage);
      note();
      kept_[cell(stage, microbatch)] = kept;
    }
    if (!last) give_message(output_gradient);
    // An input gradient handed to the previous stage on this rank is consumed by its backward;
    // one sent waits for OPTIM.
    if (kMessages && !first && shape_.rank_of_stage(stage - 1) != shape_.rank_of_stage(stage)) {
      sent_[gradient_cell(stage, microbatch)] = 1;
    }
    if (!defer) drop(stage);
  }

  void weight(int64_t stage, int64_t microbatch) {
    keep_noted();
    --deferred(stage);
    int64_t& kept = kept_[cell(stage, microbatch)];
    give_back(stage, kept);
    kept = 0;
    drop(stage);
  }

  // A moment the sum may peak: the counts now. The moment noted last is dropped where this one
  // dominates it (as result() judges: no deferred count smaller), since result() would drop it too:
  // this one, or a later moment dominating this one, dominates it. Messages growing one by one
  // (GPipe's warm-up) and a steady state's I then note millions of moments in a search and keep
  // few. So the moment noted last stays in counts_ (`noted_`) and is copied out only before a count
  // falls (keep_noted): until then every count only grows, and each later moment dominates it.
  void note() {
    if (noted_) return;
    if (!moments_.empty() && dominates_last()) moments_.resize(moments_.size() - counts_.size());
    noted_ = true;
  }
  void keep_noted() {
    if (!noted_) return;
    moments_.insert(moments_.end(), counts_.begin(), counts_.end());
    noted_ = false;
  }
  bool dominates_last() const {
    const std::size_t last = moments_.size() - counts_.size();
    for (std::size_t at = 2; at + 1 < counts_.size(); at += 3) {
      if (counts_[at] < moments_[last + at]) return false;
    }
    return true;
  }

  const WalkShape& walk_;
  const ScheduleShape& shape_;
  int64_t microbatches_;
  std::vector<int64_t> local_;  // by stage: its index among this rank's chunks, or -1
  int64_t locals_ = 0;
  std::vector<char> message_, sent_;       // by gradient_cell
  std::vector<int64_t> kept_;              // layers I lent a microbatch until its W
  std::vector<int64_t> live_sets_, lent_;  // by index
  int64_t messages_live_ = 0;
  // By index i: 3i sets ever held, 3i + 1 layer sets ever lent at once, 3i + 2 microbatches
  // awaiting W; last, messages ever held at once.
  std::vector<int64_t> counts_;
  std::vector<int64_t> moments_;  // each noted moment's counts_, one after another, but the last
  bool noted_ = false;            // the last noted moment is counts_ as they are
};

// Each stage's chunk; chunks of equal layer count and role (first, last, neither) are equal and
// computed once (with experts, of equal first layer too: which layers hold experts differs).
std::vector<ChunkBytes> chunks_by_stage(const ModelSpec& model, const ParallelPlan& plan,
                                        const ExecutorPrecision& precision, int64_t bucket_size) {
  std::map<std::tuple<int64_t, bool, bool, int64_t>, ChunkBytes> distinct;
  std::vector<ChunkBytes> by_stage;
  by_stage.reserve(static_cast<std::size_t>(plan.num_virtual_stages()));
  for (int64_t stage = 0; stage < plan.num_virtual_stages(); ++stage) {
    const StageLayers layers = stage_layers(stage, model, plan);
    const auto key = std::tuple(layers.num_layers, layers.has_embedding, layers.has_output_layer,
                                model.moe.enabled() ? layers.first_layer : int64_t{-1});
    auto found = distinct.find(key);
    if (found == distinct.end()) {
      found = distinct.emplace(key, chunk_bytes(model, plan, stage, precision, bucket_size)).first;
    }
    by_stage.push_back(found->second);
  }
  return by_stage;
}

}  // namespace

ExecutorMemoryWalk walk_executor_memory(const ModelSpec& model, const ParallelPlan& plan, const PipelineSchedule& given,
                                        bool evaluates) {
  // The executor runs the lowered list, where a stage's RECV_F is posted ahead of its F and holds
  // a message buffer from then: a compute-only list would count one message too few on a rank whose
  // stage receives (the last stage of 1F1B, the V schedules' rank 0).
  std::optional<PipelineSchedule> lowered;
  if (!given.lowered) lowered = lower_schedule(given);
  const PipelineSchedule& schedule = lowered ? *lowered : given;
  const WalkShape shape = walk_shape(model, plan);
  ExecutorMemoryWalk walk;
  for (int64_t rank = 0; rank < plan.pipeline_parallel_size; ++rank) {
    std::vector<int64_t> stages = stages_of_pipeline_rank(rank, plan);
    std::sort(stages.begin(), stages.end());
    RankWalk<true> rank_walk(shape, schedule.shape, stages);
    rank_walk.run(schedule.ranks[static_cast<std::size_t>(rank)]);
    if (evaluates) rank_walk.evaluate();
    walk.ranks.push_back(rank_walk.result());
  }
  return walk;
}

ExecutorMemoryWalk executor_memory_floor(const PipelineSchedule& schedule) {
  // RankWalk over the compute order alone, with nothing lent (no recomputation groups) and no
  // messages (lowering places them): its sets and deferred counts are the lowered walk's after the
  // same computations, so every moment it keeps is below one the lowered walk keeps.
  const ScheduleShape& shape = schedule.shape;
  WalkShape nothing_lent;
  nothing_lent.group_borrows.resize(static_cast<std::size_t>(shape.num_stages));
  nothing_lent.last_stage = shape.num_stages - 1;
  const std::vector<int32_t> stage_ranks = rank_of_each_stage(shape);
  std::vector<std::vector<int64_t>> stages(static_cast<std::size_t>(shape.pipeline_parallel_size));
  for (int64_t stage = 0; stage < shape.num_stages; ++stage) {
    stages[static_cast<std::size_t>(stage_ranks[static_cast<std::size_t>(stage)])].push_back(stage);
  }
  ExecutorMemoryWalk walk;
  for (std::size_t rank = 0; rank < stages.size(); ++rank) {
    RankWalk<false> rank_walk(nothing_lent, shape, stages[rank]);
    rank_walk.run(schedule.ranks[rank]);
    walk.ranks.push_back(rank_walk.result());
  }
  return walk;
}

std::vector<ExecutorRankMemory> price_executor_memory(const ExecutorMemoryWalk& walk, const ModelSpec& model,
                                                      const ParallelPlan& plan, const ExecutorPrecision& precision,
                                                      int64_t bucket_size) {
  const std::vector<ChunkBytes> by_stage = chunks_by_stage(model, plan, precision, bucket_size);
  std::vector<ExecutorRankMemory> ranks;
  for (std::size_t rank = 0; rank < walk.ranks.size(); ++rank) {
    const ExecutorMemoryWalk::Rank& counts = walk.ranks[rank];
    ExecutorRankMemory memory;
    memory.pipeline_rank = static_cast<int64_t>(rank);
    std::vector<int64_t> prices;  // per count, in the walk's order
    for (const int64_t stage : counts.stages) {
      const ChunkBytes& chunk = by_stage[static_cast<std::size_t>(stage)];
      memory.master_weight_bytes += chunk.master;
      memory.gradient_bytes += chunk.gradients;
      memory.compute_weight_bytes += chunk.compute;
      memory.optimizer_bytes += chunk.moments;
      memory.scratch_bytes += chunk.scratch;
      prices.insert(prices.end(), {chunk.microbatch, chunk.layer, chunk.deferred});
    }
    prices.push_back(by_stage.front().message);
    for (const std::vector<int64_t>& moment : counts.moments) {
      int64_t bytes = 0;
      for (std::size_t i = 0; i < prices.size(); ++i) bytes += moment[i] * prices[i];
      memory.activation_bytes = std::max(memory.activation_bytes, bytes);
    }
    memory.peak_inflight_microbatches = counts.most_inflight;
    memory.total_bytes = memory.master_weight_bytes + memory.gradient_bytes + memory.compute_weight_bytes +
                         memory.optimizer_bytes + memory.scratch_bytes + memory.activation_bytes;
    ranks.push_back(memory);
  }
  return ranks;
}

std::vector<ExecutorRankMemory> executor_memory_per_pipeline_rank(const ModelSpec& model, const ParallelPlan& plan,
                                                                  const PipelineSchedule& schedule,
                                                                  const ExecutorPrecision& precision,
                                                                  int64_t bucket_size, bool evaluates) {
  return price_executor_memory(walk_executor_memory(model, plan, schedule, evaluates), model, plan, precision,
                               bucket_size);
}

}  // namespace megaplan
