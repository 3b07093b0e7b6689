#include "executor/train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string>

#include "executor/train/host_values.h"

namespace megaplan::exec {

namespace {

int64_t size_of(const Comm* group) { return group ? group->size() : 1; }
int64_t rank_in(const Comm* group) { return group ? group->rank() : 0; }

}  // namespace

Comm* Optimizer::expert_replicas() const {
  return groups_.experts_apart ? groups_.expert_data_parallel : groups_.data_parallel;
}

Comm* Optimizer::group_of(const GradientBucket& bucket) const {
  Comm* group = bucket.expert ? expert_replicas() : groups_.data_parallel;
  return group && group->size() > 1 ? group : nullptr;
}

bool Optimizer::tied(const Parameter& parameter) const {
  for (StageChunk* chunk : chunks_) {
    if (chunk->output_weight_copy() == &parameter) return true;
    if (groups_.embedding && chunk->tied_embeddings() && chunk->word_embedding() == &parameter) return true;
  }
  return false;
}

Optimizer::Optimizer(std::vector<StageChunk*> chunks, const OptimizerGroups& groups, bool distributed,
                     const OptimizerSettings& settings, Backend& backend)
    : chunks_(std::move(chunks)), groups_(groups), distributed_(distributed), settings_(settings), backend_(backend) {
  const bool reduces = size_of(groups_.data_parallel) > 1 || size_of(expert_replicas()) > 1;
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    progress_.push_back({{}, std::vector<bool>(chunks_[c]->layout().buckets.size(), false)});
    gathering_.emplace_back();
    if (settings_.overlap_grad_reduce && reduces) {
      chunks_[c]->on_gradient_progress([this, c](std::size_t first) { gradients_done(c, first); });
    }
  }
  for (StageChunk* chunk : chunks_) {
    const ParameterLayout& layout = chunk->layout();
    std::vector<Parameter>& parameters = chunk->parameters();
    if (!distributed_) {
      // Moments mirror the parameter buffer; each parameter is one piece.
      float* first = backend_.allocate(layout.total);
      float* second = backend_.allocate(layout.total);
      moment_buffers_.insert(moment_buffers_.end(), {first, second});
      for (std::size_t i = 0; i < parameters.size(); ++i) {
        pieces_.push_back(
            {&parameters[i], 0, parameters[i].size, first + layout.offsets[i], second + layout.offsets[i]});
      }
      continue;
    }
    // The rank's shard of each bucket, cut at parameter boundaries into pieces.
    shard_moments_.emplace_back();
    for (const GradientBucket& bucket : layout.buckets) {
      const Comm* group = group_of(bucket);
      const std::size_t shard = bucket.shard_size(size_of(group));
      const std::size_t begin = bucket.offset + static_cast<std::size_t>(rank_in(group)) * shard, end = begin + shard;
      float* first = backend_.allocate(shard);
      float* second = backend_.allocate(shard);
      moment_buffers_.insert(moment_buffers_.end(), {first, second});
      shard_moments_.back().emplace_back(first, second);
      for (std::size_t i = bucket.first_parameter; i <= bucket.last_parameter; ++i) {
        const std::size_t lo = std::max(begin, layout.offsets[i]);
        const std::size_t hi = std::min(end, layout.offsets[i] + parameters[i].size);
        if (lo >= hi) continue;
        pieces_.push_back(
            {&parameters[i], lo - layout.offsets[i], hi - lo, first + (lo - begin), second + (lo - begin)});
      }
    }
  }
}

void Optimizer::update_expert_biases() {
  for (StageChunk* chunk : chunks_) {
    StageChunk::ExpertBiases& biases = chunk->expert_biases();
    if (biases.layers.empty()) continue;
    const std::vector<float> counts(biases.routed.begin(), biases.routed.end());
    backend_.upload(biases.counts, counts.data(), counts.size());
    for (Comm* group : {groups_.tensor_parallel, groups_.data_parallel}) {
      if (group) group->all_reduce(biases.counts, counts.size(), DType::kFloat32, ReduceOp::kSum)->wait();
    }
    for (std::size_t layer = 0; layer < biases.layers.size(); ++layer) {
      const std::size_t at = layer * biases.experts;
      backend_.moe_update_expert_bias(biases.counts + at, biases.experts,
                                      static_cast<float>(settings_.expert_bias_update_rate), biases.biases + at);
    }
    std::fill(biases.routed.begin(), biases.routed.end(), 0);
  }
}

Optimizer::~Optimizer() {
  for (StageChunk* chunk : chunks_) chunk->on_gradient_progress(nullptr);
  for (float* buffer : moment_buffers_) backend_.release(buffer);
}

std::size_t Optimizer::chunk_of(int64_t stage, const char* action) const {
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    if (chunks_[c]->stage() == stage) return c;
  }
  throw std::logic_error(std::string(action) + " of a stage this rank does not hold");
}

void Optimizer::reduce_gradients(int64_t stage) {
  const std::size_t c = chunk_of(stage, "REDUCE_GRAD");
  for (std::size_t b = 0; b < chunks_[c]->layout().buckets.size(); ++b) {
    if (!progress_[c].started[b]) start_reduction(c, b);
  }
  if (!settings_.overlap_grad_reduce) finish_reductions();
}

void Optimizer::gradients_done(std::size_t chunk, std::size_t first) {
  Progress& progress = progress_[chunk];
  if (++progress.done[first] < settings_.microbatches) return;
  const std::vector<GradientBucket>& buckets = chunks_[chunk]->layout().buckets;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    if (!progress.started[b] && buckets[b].first_parameter >= first) start_reduction(chunk, b);
  }
}

void Optimizer::start_reduction(std::size_t c, std::size_t b) {
  StageChunk& chunk = *chunks_[c];
  const GradientBucket& bucket = chunk.layout().buckets[b];
  progress_[c].started[b] = true;
  // The tensor-parallel sum of the replicated tensors' partial gradients comes first: the
  // data-parallel reduction (a reduce-scatter under the distributed optimizer) reads whole gradients.
  chunk.reduce_replicated_gradients(bucket.first_parameter, bucket.last_parameter);
  Comm* group = group_of(bucket);
  if (!group) return;  // one member: the sum is the rank's own
  Comm& dp = *group;
  float* data = chunk.gradient_buffer() + bucket.offset;
  bool holds_tied = false;
  for (std::size_t i = bucket.first_parameter; i <= bucket.last_parameter; ++i) {
    holds_tied = holds_tied || tied(chunk.parameters()[i]);
  }
  if (distributed_ && !holds_tied) {
    const std::size_t shard = bucket.shard_size(dp.size());
    reducing_.push_back(dp.reduce_scatter(data, data + static_cast<std::size_t>(dp.rank()) * shard, shard,
                                          DType::kFloat32, ReduceOp::kSum));
  } else {
    reducing_.push_back(dp.all_reduce(data, bucket.size, DType::kFloat32, ReduceOp::kSum));
  }
}

void Optimizer::finish_gather(std::size_t c) {
  if (gathering_[c].empty()) return;
  for (Request& request : gathering_[c]) request->wait();
  gathering_[c].clear();
  chunks_[c]->refresh_compute_weights();
}

void Optimizer::parameters_ready(int64_t stage) { finish_gather(chunk_of(stage, "F")); }

void Optimizer::finish_parameter_gathers() {
  for (std::size_t c = 0; c < chunks_.size(); ++c) finish_gather(c);
}

void Optimizer::finish_reductions() {
  for (Request& request : reducing_) request->wait();
  reducing_.clear();
  for (Progress& progress : progress_) {
    progress.done.clear();
    std::fill(progress.started.begin(), progress.started.end(), false);
  }
}

std::vector<OptimizerTensor> Optimizer::tensors(bool for_norm, bool experts) const {
  std::vector<OptimizerTensor> result;
  result.reserve(pieces_.size());
  for (const Piece& piece : pieces_) {
    const Parameter& p = *piece.parameter;
    if (for_norm && p.expert != experts) continue;
    // The tied output weight's copy repeats the word embedding's gradient, and a replicated tensor
    // repeats on every tensor-parallel rank: each counted once (Megatron counts tp rank 0's).
    if (for_norm) {
      bool copy = false;
      for (StageChunk* chunk : chunks_) {
        copy = copy || chunk->output_weight_copy() == &p ||
               (p.split == TensorSplit::kReplicated && chunk->tensor_parallel_rank() != 0);
      }
      if (copy) continue;
    }
    const bool whole = piece.offset == 0 && piece.size == p.size;
    result.push_back({p.value + piece.offset, p.gradient + piece.offset, piece.first_moment, piece.second_moment,
                      whole ? p.compute : nullptr, piece.size, p.weight_decay ? settings_.weight_decay : 0.0});
  }
  return result;
}

double Optimizer::gradient_norm() {
  finish_reductions();  // the overlapped ones end here, before anything reads a gradient
  // The tied embedding's two gradients become their sum on both stages first.
  if (Comm* embedding = groups_.embedding; embedding && chunks_.front()->tied_embeddings()) {
    for (StageChunk* chunk : chunks_) {
      Parameter* weight = chunk->first_stage() ? chunk->word_embedding() : chunk->output_weight_copy();
      if (weight) embedding->all_reduce(weight->gradient, weight->size, DType::kFloat32, ReduceOp::kSum)->wait();
    }
  }
  // The squares of what the rank updates (its shards under the distributed optimizer) summed over
  // the ranks that update the rest: the others' over dp, the routed experts' over expert dp and the
  // ranks holding other experts; then both over the model's tensor and pipeline ranks.
  double sum_of_squares = backend_.gradient_sum_of_squares(tensors(true));
  if (distributed_ && groups_.data_parallel)
    sum_of_squares = sum_over(*groups_.data_parallel, backend_, sum_of_squares);
  double expert_squares = 0;
  if (const std::vector<OptimizerTensor> experts = tensors(true, true); !experts.empty()) {
    expert_squares = backend_.gradient_sum_of_squares(experts);
    for (Comm* group : {distributed_ ? expert_replicas() : nullptr, groups_.expert_parallel}) {
      if (group) expert_squares = sum_over(*group, backend_, expert_squares);
    }
  }
  if (!groups_.experts_cut_apart) {
    sum_of_squares += expert_squares;
    if (groups_.model_parallel) sum_of_squares = sum_over(*groups_.model_parallel, backend_, sum_of_squares);
    return std::sqrt(sum_of_squares);
  }
  // Experts cut over a group other than tp: each part over the ranks holding its other shards.
  if (groups_.model_parallel) sum_of_squares = sum_over(*groups_.model_parallel, backend_, sum_of_squares);
  for (Comm* group : {groups_.expert_tensor_parallel, groups_.pipeline}) {
    if (group) expert_squares = sum_over(*group, backend_, expert_squares);
  }
  return std::sqrt(sum_of_squares + expert_squares);
}

void Optimizer::step(int64_t update, double lr, double gradient_norm, double unscale) {
  const double clip = settings_.clip_grad > 0 && gradient_norm > settings_.clip_grad
                          ? settings_.clip_grad / (gradient_norm + 1e-6)
                          : 1.0;
  backend_.adamw_step(tensors(false), {update, lr, settings_.beta1, settings_.beta2, settings_.eps, clip * unscale});
  if (distributed_) {
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      StageChunk& chunk = *chunks_[c];
      for (const GradientBucket& bucket : chunk.layout().buckets) {
        Comm* group = group_of(bucket);
        if (!group) continue;  // the rank updated the whole bucket
        const std::size_t shard = bucket.shard_size(group->size());
        float* data = chunk.parameter_buffer() + bucket.offset;
        gathering_[c].push_back(
            group->all_gather(data + static_cast<std::size_t>(group->rank()) * shard, data, shard, DType::kFloat32));
      }
      if (!settings_.overlap_param_gather) finish_gather(c);
    }
  }
  for (StageChunk* chunk : chunks_) chunk->zero_gradients();
}

void Optimizer::skip() {
  for (StageChunk* chunk : chunks_) chunk->zero_gradients();
}

void Optimizer::visit_moments(const MomentVisitor& visit) {
  if (!distributed_) {
    // The pieces are whole parameters.
    for (const Piece& piece : pieces_) visit(*piece.parameter, piece.first_moment, piece.second_moment);
    return;
  }
  // Each bucket's shards gathered over its group into buffers laid out as the chunk's parameter
  // buffer; a bucket of a group of one is its own shard, read where it is.
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    const ParameterLayout& layout = chunks_[c]->layout();
    bool gathers = false;
    for (const GradientBucket& bucket : layout.buckets) gathers = gathers || group_of(bucket) != nullptr;
    float* first = gathers ? backend_.allocate(layout.total) : nullptr;
    float* second = gathers ? backend_.allocate(layout.total) : nullptr;
    const std::vector<Parameter>& parameters = chunks_[c]->parameters();
    std::vector<std::pair<const float*, const float*>> moments(parameters.size());  // by registration index
    std::vector<Request> pending;
    for (std::size_t b = 0; b < layout.buckets.size(); ++b) {
      const GradientBucket& bucket = layout.buckets[b];
      Comm* group = group_of(bucket);
      const float* whole_first = shard_moments_[c][b].first;
      const float* whole_second = shard_moments_[c][b].second;
      if (group) {
        const std::size_t shard = bucket.shard_size(group->size());
        pending.push_back(group->all_gather(shard_moments_[c][b].first, first + bucket.offset, shard, DType::kFloat32));
        pending.push_back(
            group->all_gather(shard_moments_[c][b].second, second + bucket.offset, shard, DType::kFloat32));
        whole_first = first + bucket.offset;
        whole_second = second + bucket.offset;
      }
      for (std::size_t i = bucket.first_parameter; i <= bucket.last_parameter; ++i) {
        const std::size_t at = layout.offsets[i] - bucket.offset;
        moments[i] = {whole_first + at, whole_second + at};
      }
    }
    const auto release = [&] {
      if (first) backend_.release(first);
      if (second) backend_.release(second);
    };
    try {
      for (Request& request : pending) request->wait();
      for (std::size_t i = 0; i < parameters.size(); ++i) visit(parameters[i], moments[i].first, moments[i].second);
    } catch (...) {
      release();
      throw;
    }
    release();
  }
}

void Optimizer::import_moment(const Parameter& parameter, bool second, std::size_t begin, const float* host,
                              std::size_t n) {
  if (begin + n > parameter.size) {
    throw std::logic_error("Optimizer::import_moment: elements past the end of " + parameter.name);
  }
  bool found = false;
  for (const Piece& piece : pieces_) {
    if (piece.parameter != &parameter) continue;
    found = true;
    const std::size_t lo = std::max(begin, piece.offset), hi = std::min(begin + n, piece.offset + piece.size);
    if (lo >= hi) continue;
    float* moment = second ? piece.second_moment : piece.first_moment;
    backend_.upload(moment + (lo - piece.offset), host + (lo - begin), hi - lo);
  }
  // A distributed optimizer's rank may own no piece of a small parameter; it must still be one of its chunks'.
  if (!found && !distributed_) {
    throw std::logic_error("Optimizer::import_moment: " + parameter.name + " is not this optimizer's");
  }
}

std::string Optimizer::first_non_finite_gradient() {
  for (StageChunk* chunk : chunks_) {
    for (const Parameter& p : chunk->parameters()) {
      const OptimizerTensor one{p.value, p.gradient, nullptr, nullptr, nullptr, p.size, 0.0};
      if (!std::isfinite(backend_.gradient_sum_of_squares({one}))) return p.name;
    }
  }
  return "";
}

}  // namespace megaplan::exec
