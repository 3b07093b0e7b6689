// The executor's allocations, walked through each rank's action list (see executor_memory.h).
#include "core/executor_memory.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "core/checked_math.h"
#include "core/formulas.h"
#include "core/parameter_list.h"
#include "core/pipeline_layout.h"

namespace megaplan {

namespace {

constexpr int64_t kFloat = 4;

// One chunk's buffer sizes, in bytes.
struct ChunkBytes {
  int64_t master = 0, gradients = 0, compute = 0, moments = 0, scratch = 0;
  int64_t microbatch = 0;  // one in-flight set
  int64_t layer = 0;       // one whole-layer set of the recomputation pool
  int64_t deferred = 0;    // I's kept output gradients (and the embedding's input gradient) until W
  bool forward_borrows = false;       // a layer keeps less than everything: F runs it on a lent set
  std::vector<int64_t> group_borrows;  // sets each recomputation group borrows in the backward
  int64_t message = 0;     // one activation or gradient message
  bool first = false, last = false;
};

ChunkBytes chunk_bytes(const ModelSpec& model, const ParallelPlan& plan, int64_t stage,
                       const ExecutorPrecision& precision, int64_t bucket_size) {
  const int64_t a = precision.activation_bytes;
  const int64_t tp = plan.tensor_parallel_size;
  const int64_t h = model.hidden_size;
  const int64_t tokens = tokens_per_microbatch(model, plan);
  const int64_t rows = plan.sequence_parallel ? tokens / tp : tokens;  // of the residual stream
  const int64_t q = model.query_projection_size() / tp;
  const int64_t qkv = (model.query_projection_size() + 2 * model.kv_projection_size()) / tp;
  const int64_t fc1 = mlp_input_width(model) / tp;
  const int64_t ffn = model.effective_ffn_hidden_size() / tp;
  const int64_t vocabulary = padded_vocab_size(model, tp) / tp;
  const int64_t heads = model.num_attention_heads / tp;
  const StageLayers layers = stage_layers(stage, model, plan);

  ChunkBytes bytes;
  bytes.first = layers.has_embedding;
  bytes.last = layers.has_output_layer;
  bytes.message = a * rows * h;
  const int64_t parameters = stage_parameters(model, plan, stage).parameters_per_gpu;
  const ParameterLayout layout = stage_layout(model, plan, stage, static_cast<std::size_t>(bucket_size));
  const auto buffer = static_cast<int64_t>(layout.total);
  bytes.master = kFloat * buffer;
  bytes.gradients = kFloat * buffer;
  bytes.compute = a == kFloat ? 0 : a * parameters;
  if (plan.use_distributed_optimizer) {
    int64_t shard = 0;
    for (const GradientBucket& bucket : layout.buckets) shard += static_cast<int64_t>(bucket.shard_size(plan.data_parallel_size));
    bytes.moments = 2 * kFloat * shard;
  } else {
    bytes.moments = 2 * kFloat * buffer;
  }
  // norm_out_, branch_out_, d_residual_ x 2 (rows); d_hidden_ (tokens); d_qkv_, d_ffn_ (the
  // rank's share); under sequence parallelism gathered_ and partial_; the loss's row statistics.
  bytes.scratch = a * (4 * rows * h + tokens * h + tokens * (qkv + fc1)) +
                  (plan.sequence_parallel ? 2 * a * tokens * h : 0) + (bytes.last ? kFloat * 2 * tokens : 0);

  const int64_t saved_per_row = precision.attention_keeps_probabilities ? model.seq_length : 1;
  const int64_t attention = a * tokens * q + kFloat * plan.micro_batch_size * heads * model.seq_length * saved_per_row;
  const int64_t input = a * rows * h;
  // input, middle (rows); qkv, fc1's output, the activation's output (tokens, the rank's share);
  // the two norms' mean and rstd; the attention core's output and saved statistics.
  bytes.layer = 2 * input + a * tokens * (qkv + fc1 + ffn) + kFloat * 4 * rows + attention;
  const std::vector<LayerGroup> groups = recompute_groups(model, plan);
  bytes.microbatch = input;  // the chunk's output
  for (const LayerKeep keep : layer_keeps(plan, groups)) {
    bytes.microbatch += keep == LayerKeep::kAll ? bytes.layer
                        : keep == LayerKeep::kAllButAttention ? bytes.layer - attention
                        : keep == LayerKeep::kInput ? input
                                               : 0;
    bytes.forward_borrows = bytes.forward_borrows || keep != LayerKeep::kAll;
  }
  if (bytes.last) bytes.microbatch += a * tokens * (h + vocabulary) + kFloat * (2 * rows + tokens);
  for (const LayerGroup& group : groups) {
    const bool selective = plan.recompute_granularity == RecomputeGranularity::kSelective;
    bytes.group_borrows.push_back(group.recomputed ? group.num_layers : selective ? group.num_layers : 0);
  }
  // Per layer, I keeps the output gradients of fc2 and the projection (hidden wide), fc1 and QKV.
  bytes.deferred = layers.num_layers * a * tokens * (2 * h + fc1 + qkv) + (bytes.first ? a * tokens * h : 0);
  return bytes;
}

// One pipeline rank's walk: high-water marks of what is pooled, and the peak of the sum. State is
// indexed by (the rank's chunk, microbatch) in flat vectors: the planner walks ~10^4 plans'
// schedules of up to thousands of microbatches.
class RankWalk {
 public:
  // `chunks[s]`: stage s's buffers when it is on this rank, else null.
  RankWalk(const std::vector<const ChunkBytes*>& chunks, const ScheduleShape& shape)
      : chunks_(chunks), shape_(shape), microbatches_(shape.microbatches), local_(chunks.size(), -1) {
    for (std::size_t stage = 0; stage < chunks.size(); ++stage) {
      const ChunkBytes* chunk = chunks[stage];
      if (!chunk) continue;
      local_[stage] = locals_++;
      static_bytes_ += chunk->master + chunk->gradients + chunk->compute + chunk->moments + chunk->scratch;
      message_bytes_ = chunk->message;
    }
    const auto cells = static_cast<std::size_t>(locals_ * microbatches_);
    held_.assign(cells, 0);
    kept_.assign(cells, 0);
    message_.assign(2 * cells, 0);
    sent_.assign(2 * cells, 0);
    for (auto* counts : {&live_sets_, &sets_, &lent_, &lent_peak_}) counts->assign(static_cast<std::size_t>(locals_), 0);
    note();
  }

  void run(const Action& action) {
    switch (action.kind) {
      case ActionKind::kForward:
        forward(action.stage, action.microbatch);
        break;
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput:
        backward(action.stage, action.microbatch, action.kind == ActionKind::kBackwardInput);
        break;
      case ActionKind::kBackwardWeight:
        weight(action.stage, action.microbatch);
        break;
      case ActionKind::kOverlapForwardBackward: {
        const ActionParts parts = parts_of(action);
        // The interpreter issues a pair of two chunks backward first (Backend::run_pair's order).
        const bool one_chunk = parts.parts[0].stage == parts.parts[1].stage;
        run(parts.parts[one_chunk ? 0 : 1]);
        run(parts.parts[one_chunk ? 1 : 0]);
        break;
      }
      case ActionKind::kRecvForward:
        hold(action.stage, action.microbatch);
        break;
      case ActionKind::kRecvBackward:
        take_message(gradient_cell(action.stage + 1, action.microbatch));  // the gradient of stage s's output
        break;
      case ActionKind::kSendBackward:
        sent_[gradient_cell(action.stage, action.microbatch)] = 1;
        break;
      case ActionKind::kOptimizer:
        for (std::size_t c = 0; c < sent_.size(); ++c) {
          if (sent_[c]) give_message(c);
          sent_[c] = 0;
        }
        break;
      case ActionKind::kSendForward:
      case ActionKind::kReduceGrad:
        break;
    }
  }

  // Evaluation's two message buffers, after the iteration.
  void evaluate() { peak_ = std::max(peak_, static_bytes_ + pooled_ + deferred_ + 2 * message_bytes_); }

  int64_t peak() const { return peak_; }
  int64_t static_bytes() const { return static_bytes_; }
  int64_t most_inflight() const {
    int64_t total = 0;
    for (const int64_t count : sets_) total += count;
    return total;
  }

 private:
  std::size_t index(int64_t stage) const { return static_cast<std::size_t>(local_[static_cast<std::size_t>(stage)]); }
  std::size_t cell(int64_t stage, int64_t microbatch) const {
    return index(stage) * static_cast<std::size_t>(microbatches_) + static_cast<std::size_t>(microbatch);
  }
  // The gradient at stage s's input: written by this rank's stage s, or received for (or handed
  // over to) this rank's stage s - 1 as the gradient of its output.
  std::size_t gradient_cell(int64_t stage, int64_t microbatch) const {
    const bool here = stage < static_cast<int64_t>(chunks_.size()) && chunks_[static_cast<std::size_t>(stage)];
    return 2 * cell(here ? stage : stage - 1, microbatch) + (here ? 0 : 1);
  }
  const ChunkBytes& chunk(int64_t stage) const { return *chunks_[static_cast<std::size_t>(stage)]; }

  // A microbatch's set on `stage`: taken at its RECV_F or F, whichever comes first.
  void hold(int64_t stage, int64_t microbatch) {
    char& held = held_[cell(stage, microbatch)];
    if (held) return;
    held = 1;
    const std::size_t s = index(stage);
    if (++live_sets_[s] > sets_[s]) {
      sets_[s] = live_sets_[s];
      pooled_ += chunk(stage).microbatch;
      note();
    }
  }
  void drop(int64_t stage, int64_t microbatch) {
    held_[cell(stage, microbatch)] = 0;
    --live_sets_[index(stage)];
  }
  void borrow(int64_t stage, int64_t count) {
    const std::size_t s = index(stage);
    lent_[s] += count;
    if (lent_[s] > lent_peak_[s]) {
      pooled_ += (lent_[s] - lent_peak_[s]) * chunk(stage).layer;
      lent_peak_[s] = lent_[s];
      note();
    }
  }
  void give_back(int64_t stage, int64_t count) { lent_[index(stage)] -= count; }
  // Message buffers, keyed by gradient_cell.
  void take_message(std::size_t c) {
    message_[c] = 1;
    if (++messages_live_ > messages_peak_) {
      messages_peak_ = messages_live_;
      pooled_ += message_bytes_;
      note();
    }
  }
  void give_message(std::size_t c) {
    if (!message_[c]) return;
    message_[c] = 0;
    --messages_live_;
  }

  void forward(int64_t stage, int64_t microbatch) {
    hold(stage, microbatch);
    if (chunk(stage).forward_borrows) {
      borrow(stage, 1);
      give_back(stage, 1);
    }
  }

  void backward(int64_t stage, int64_t microbatch, bool defer) {
    const ChunkBytes& c = chunk(stage);
    // The gradient of the stage's output: received (RECV_B), or handed over by the next stage on
    // this rank; a compute-only schedule has neither, so it arrives now.
    const std::size_t output_gradient = gradient_cell(stage + 1, microbatch);
    if (!c.last && !message_[output_gradient]) take_message(output_gradient);
    if (!c.first) take_message(gradient_cell(stage, microbatch));  // the input gradient this backward writes
    int64_t kept = 0;
    for (auto g = c.group_borrows.size(); g-- > 0;) {
      borrow(stage, c.group_borrows[g]);
      if (defer) {
        kept += c.group_borrows[g];
      } else {
        give_back(stage, c.group_borrows[g]);
      }
    }
    if (defer) {
      deferred_ += c.deferred;
      note();
      kept_[cell(stage, microbatch)] = kept;
    }
    if (!c.last) give_message(output_gradient);
    // An input gradient handed to the previous stage on this rank is consumed by its backward;
    // one sent waits for OPTIM.
    if (!c.first && shape_.rank_of_stage(stage - 1) != shape_.rank_of_stage(stage)) {
      sent_[gradient_cell(stage, microbatch)] = 1;
    }
    if (!defer) drop(stage, microbatch);
  }

  void weight(int64_t stage, int64_t microbatch) {
    deferred_ -= chunk(stage).deferred;
    int64_t& kept = kept_[cell(stage, microbatch)];
    give_back(stage, kept);
    kept = 0;
    drop(stage, microbatch);
  }

  void note() { peak_ = std::max(peak_, static_bytes_ + pooled_ + deferred_); }

  const std::vector<const ChunkBytes*>& chunks_;  // by stage: null for other ranks' stages
  const ScheduleShape& shape_;
  int64_t microbatches_;
  std::vector<int64_t> local_;  // by stage: its index among this rank's chunks, or -1
  int64_t locals_ = 0;
  int64_t static_bytes_ = 0, message_bytes_ = 0;
  int64_t pooled_ = 0;    // sets, lent layers and messages ever allocated: kept for reuse
  int64_t deferred_ = 0;  // I's gradients awaiting W
  int64_t peak_ = 0;
  std::vector<char> held_;            // by cell
  std::vector<char> message_, sent_;  // by gradient_cell
  std::vector<int64_t> kept_;                // layers I lent a microbatch until its W
  std::vector<int64_t> live_sets_, sets_, lent_, lent_peak_;  // by index
  int64_t messages_live_ = 0, messages_peak_ = 0;
};

}  // namespace

std::vector<ExecutorRankMemory> executor_memory_per_pipeline_rank(const ModelSpec& model, const ParallelPlan& plan,
                                                                 const PipelineSchedule& schedule,
                                                                 const ExecutorPrecision& precision,
                                                                 int64_t bucket_size, bool evaluates) {
  // Chunks of equal layer count and role (first, last, neither) have equal buffers: computed once.
  std::map<std::tuple<int64_t, bool, bool>, ChunkBytes> distinct;
  std::vector<ChunkBytes> by_stage;
  by_stage.reserve(static_cast<std::size_t>(plan.num_virtual_stages()));
  for (int64_t stage = 0; stage < plan.num_virtual_stages(); ++stage) {
    const StageLayers layers = stage_layers(stage, model, plan);
    const auto key = std::tuple(layers.num_layers, layers.has_embedding, layers.has_output_layer);
    auto found = distinct.find(key);
    if (found == distinct.end()) {
      found = distinct.emplace(key, chunk_bytes(model, plan, stage, precision, bucket_size)).first;
    }
    by_stage.push_back(found->second);
  }
  std::vector<ExecutorRankMemory> ranks;
  for (int64_t rank = 0; rank < plan.pipeline_parallel_size; ++rank) {
    std::vector<const ChunkBytes*> chunks(static_cast<std::size_t>(plan.num_virtual_stages()), nullptr);
    ExecutorRankMemory memory;
    memory.pipeline_rank = rank;
    for (const int64_t stage : stages_of_pipeline_rank(rank, plan)) {
      const ChunkBytes& chunk = by_stage[static_cast<std::size_t>(stage)];
      chunks[static_cast<std::size_t>(stage)] = &chunk;
      memory.master_weight_bytes += chunk.master;
      memory.gradient_bytes += chunk.gradients;
      memory.compute_weight_bytes += chunk.compute;
      memory.optimizer_bytes += chunk.moments;
      memory.scratch_bytes += chunk.scratch;
    }
    RankWalk walk(chunks, schedule.shape);
    for (const Action& action : schedule.ranks[static_cast<std::size_t>(rank)]) walk.run(action);
    if (evaluates) walk.evaluate();
    memory.activation_bytes = walk.peak() - walk.static_bytes();
    memory.peak_inflight_microbatches = walk.most_inflight();
    memory.total_bytes = walk.peak();
    ranks.push_back(memory);
  }
  return ranks;
}

}  // namespace megaplan
