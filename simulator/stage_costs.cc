// Kernel lists per layer and per stage, costed by the profile.
#include "simulator/stage_costs.h"

#include <algorithm>

#include "core/formulas.h"
#include "core/pipeline_layout.h"
#include "core/rank_groups.h"

namespace megaplan::sim {

namespace {

constexpr int64_t kBf16 = 2;
constexpr int64_t kFp32 = 4;

LinkKind kind_of(const Route& route) { return route.crosses_nodes ? LinkKind::kNetwork : LinkKind::kNvlink; }
LinkParams params_of(const Route& route) { return {route.bandwidth_bytes_per_s, route.latency_s}; }

// A forward GEMM X[m x k] W[k x n] and its two backward GEMMs: dX = dY W^T, dW = X^T dY.
struct Gemm {
  int64_t m, n, k;
};

struct GemmCosts {
  double forward = 0;
  double input_gradient = 0;
  double weight_gradient = 0;
};

GemmCosts cost_gemms(const std::vector<Gemm>& gemms, const Profile& profile, CostSources& sources) {
  GemmCosts costs;
  for (const Gemm& g : gemms) {
    costs.forward += profile.gemm_seconds(g.m, g.n, g.k, DType::kBf16, sources);
    costs.input_gradient += profile.gemm_seconds(g.m, g.k, g.n, DType::kBf16, sources);
    costs.weight_gradient += profile.gemm_seconds(g.k, g.n, g.m, DType::kBf16, sources);
  }
  return costs;
}

class CollectiveCoster {
 public:
  CollectiveCoster(const Profile& profile, const Route& route, int64_t group_size, CostSources& sources)
      : profile_(profile), route_(route), group_size_(group_size), sources_(sources) {}
  double operator()(CollectiveOp op, int64_t bytes) const {
    if (group_size_ <= 1) return 0;
    return profile_.collective_seconds(op, group_size_, bytes, kind_of(route_), params_of(route_), sources_);
  }

 private:
  const Profile& profile_;
  const Route route_;
  const int64_t group_size_;
  CostSources& sources_;
};

Route slower(const Route& a, const Route& b) {
  if (a.bandwidth_bytes_per_s != b.bandwidth_bytes_per_s) return a.bandwidth_bytes_per_s < b.bandwidth_bytes_per_s ? a : b;
  return a.latency_s >= b.latency_s ? a : b;
}

bool same_routes(const GroupRoutes& a, const GroupRoutes& b) {
  const auto same = [](const Route& x, const Route& y) {
    return x.bandwidth_bytes_per_s == y.bandwidth_bytes_per_s && x.latency_s == y.latency_s &&
           x.crosses_nodes == y.crosses_nodes;
  };
  return same(a.tensor, b.tensor) && same(a.context, b.context) && same(a.data, b.data);
}

RankGenerator decoder_ranks(const ParallelPlan& plan) {
  return RankGenerator("decoder", plan.tensor_parallel_size, 1, plan.data_parallel_size, plan.pipeline_parallel_size,
                       plan.context_parallel_size, std::string(kDefaultParallelOrder));
}

}  // namespace

int64_t gradient_bucket_parameters(int64_t data_parallel_size) {
  return std::max<int64_t>(40'000'000, 1'000'000 * data_parallel_size);
}

std::vector<GroupRoutes> pipeline_group_routes(const ParallelPlan& plan, const Topology& topology) {
  const RankGenerator ranks = decoder_ranks(plan);
  // Which pipeline rank each global rank belongs to: its position in its pipeline group.
  std::vector<std::size_t> pipeline_rank(static_cast<std::size_t>(ranks.world_size()));
  for (const std::vector<int64_t>& group : ranks.get_ranks("pp")) {
    for (std::size_t position = 0; position < group.size(); ++position) {
      pipeline_rank[static_cast<std::size_t>(group[position])] = position;
    }
  }
  const Route none = topology.ring_route({0});
  std::vector<GroupRoutes> routes(static_cast<std::size_t>(plan.pipeline_parallel_size), GroupRoutes{none, none, none});
  for (const auto& [token, member] : {std::pair{"tp", &GroupRoutes::tensor}, std::pair{"cp", &GroupRoutes::context},
                                      std::pair{"dp-cp", &GroupRoutes::data}}) {
    for (const std::vector<int64_t>& group : ranks.get_ranks(token)) {
      Route& slowest = routes[pipeline_rank[static_cast<std::size_t>(group.front())]].*member;
      slowest = slower(slowest, topology.ring_route(group));
    }
  }
  return routes;
}

LayerCosts transformer_layer_costs(const ModelSpec& model, const ParallelPlan& plan, const Profile& profile,
                                   const GroupRoutes& routes, CostSources& sources) {
  const int64_t t = plan.tensor_parallel_size;
  const int64_t cp = plan.context_parallel_size;
  const int64_t tokens = tokens_per_microbatch(model, plan);  // GEMM rows
  const int64_t h = model.hidden_size;
  const int64_t f = model.effective_ffn_hidden_size();
  const int64_t q = model.query_projection_size();
  const int64_t kv = model.kv_projection_size();
  const int64_t fc1_width = f * (model.swiglu ? 2 : 1);

  // Column-parallel QKV and fc1 split their outputs over tp; row-parallel projection and fc2
  // split their inputs.
  const GemmCosts gemms = cost_gemms(
      {{tokens, (q + 2 * kv) / t, h}, {tokens, h, q / t}, {tokens, fc1_width / t, h}, {tokens, h, f / t}}, profile,
      sources);

  // Flash attention over the whole sequence; context parallelism splits the queries.
  const int64_t batch_heads = plan.micro_batch_size * model.num_attention_heads / t;
  const int64_t head_dim = model.effective_kv_channels();
  const double attention_forward =
      profile.attention_forward_seconds(batch_heads, model.seq_length, head_dim, true, sources) / static_cast<double>(cp);
  const double attention_backward =
      profile.attention_backward_seconds(batch_heads, model.seq_length, head_dim, true, sources) / static_cast<double>(cp);

  // Element-wise passes in bf16: two norms (read, write), two residual adds (two reads, a write),
  // the activation (GELU reads one input; SwiGLU two), rotary embeddings on Q and K. Norms and
  // residuals run on the sequence shard under sequence parallelism. Backward moves about twice
  // the bytes (gradients in, saved inputs, gradients out).
  const int64_t outside = tokens * h / (plan.sequence_parallel ? t : 1);
  int64_t elementwise_bytes = kBf16 * (2 * 2 * outside + 2 * 3 * outside);
  elementwise_bytes += kBf16 * tokens * (fc1_width + f) / t;
  if (model.position_embedding_type == PositionEmbedding::kRope) elementwise_bytes += kBf16 * 2 * tokens * (q + kv) / t;
  const double elementwise_forward = profile.elementwise_seconds(elementwise_bytes, sources);
  const double elementwise_backward = profile.elementwise_seconds(2 * elementwise_bytes, sources);

  // Tensor parallelism: two all-reduces of the layer's output per pass, or with sequence
  // parallelism two all-gathers and two reduce-scatters of the same tensor.
  const CollectiveCoster tensor(profile, routes.tensor, t, sources);
  const int64_t activation_bytes = kBf16 * tokens * h;
  const double tensor_collectives =
      plan.sequence_parallel
          ? 2 * (tensor(CollectiveOp::kAllGather, activation_bytes) + tensor(CollectiveOp::kReduceScatter, activation_bytes))
          : 2 * tensor(CollectiveOp::kAllReduce, activation_bytes);

  // Context parallelism: K and V go round the cp ring (twice as much with their gradients in the
  // backward), overlapping the attention blocks; only what attention does not cover is exposed.
  double context_forward = 0;
  double context_backward = 0;
  if (cp > 1) {
    const CollectiveCoster context(profile, routes.context, cp, sources);
    const int64_t kv_bytes = kBf16 * 2 * tokens * kv / t;
    const double ring = context(CollectiveOp::kAllGather, kv_bytes * cp);
    context_forward = std::max(0.0, ring - attention_forward);
    context_backward = std::max(0.0, 2 * ring - attention_backward);
  }

  LayerCosts layer;
  layer.forward_collectives = tensor_collectives + context_forward;
  layer.forward = gemms.forward + attention_forward + elementwise_forward + layer.forward_collectives;
  layer.backward_collectives = tensor_collectives + context_backward;
  layer.backward_input = gemms.input_gradient + attention_backward + elementwise_backward + layer.backward_collectives;
  layer.backward_weight = gemms.weight_gradient;
  // Recomputation repeats forward work inside the backward: the attention core (selective) or
  // the whole layer with its collectives (full).
  if (plan.recompute_granularity == RecomputeGranularity::kSelective) {
    layer.backward_input += attention_forward;
  } else if (plan.recompute_granularity == RecomputeGranularity::kFull) {
    // Costs are per average layer of a stage: only the layers --recompute-method checkpoints
    // run forward again (all of them under uniform, the first N under block).
    int64_t recomputed = 0;
    for (const LayerGroup& group : recompute_groups(model, plan)) recomputed += group.recomputed ? group.num_layers : 0;
    const double fraction = static_cast<double>(recomputed) / static_cast<double>(layers_per_virtual_stage(model, plan));
    layer.backward_input += fraction * layer.forward;
    layer.backward_collectives += fraction * layer.forward_collectives;
  }
  return layer;
}

LayerCosts output_layer_costs(const ModelSpec& model, const ParallelPlan& plan, const Profile& profile,
                              const Route& tensor_route, CostSources& sources) {
  // The final norm, the vocabulary-parallel projection, and the cross entropy over fp32 logits
  // (bf16 in, fp32 softmax out; back the other way).
  const int64_t t = plan.tensor_parallel_size;
  const int64_t tokens = tokens_per_microbatch(model, plan);
  const int64_t h = model.hidden_size;
  const int64_t vocabulary = padded_vocab_size(model, t);
  const int64_t activation_bytes = kBf16 * tokens * h;
  const CollectiveCoster tensor(profile, tensor_route, t, sources);
  const GemmCosts gemms = cost_gemms({{tokens, vocabulary / t, h}}, profile, sources);
  const int64_t logits = tokens * vocabulary / t;
  const double gather = plan.sequence_parallel ? tensor(CollectiveOp::kAllGather, activation_bytes) : 0;
  const double scatter = plan.sequence_parallel ? tensor(CollectiveOp::kReduceScatter, activation_bytes)
                                                : tensor(CollectiveOp::kAllReduce, activation_bytes);
  const double norm_bytes = static_cast<double>(4 * activation_bytes / (plan.sequence_parallel ? t : 1));
  LayerCosts head;
  head.forward_collectives = gather;
  head.forward = gemms.forward + gather +
                 profile.elementwise_seconds(static_cast<int64_t>(norm_bytes) + (kBf16 + kFp32) * logits, sources);
  head.backward_collectives = scatter;
  head.backward_input = gemms.input_gradient + scatter +
                        profile.elementwise_seconds(static_cast<int64_t>(2 * norm_bytes) + (kFp32 + kBf16) * logits, sources);
  head.backward_weight = gemms.weight_gradient;
  return head;
}

double optimizer_step_seconds(const ParallelPlan& plan, int64_t parameters_per_gpu, const Profile& profile,
                              const Route& data_route, CostSources& sources) {
  // Adam on the rank's (shard of) parameters: read master weights, moments and the gradient,
  // write master weights, moments and the bf16 parameters: 30 bytes per parameter.
  const int64_t replicas = plan.data_parallel_size * plan.context_parallel_size;
  const int64_t shard = plan.use_distributed_optimizer ? parameters_per_gpu / replicas : parameters_per_gpu;
  double seconds = profile.elementwise_seconds(30 * shard, sources);
  const CollectiveCoster data(profile, data_route, replicas, sources);
  if (plan.use_distributed_optimizer) seconds += data(CollectiveOp::kAllGather, kBf16 * parameters_per_gpu);
  return seconds;
}

ActionCosts plan_action_costs(const ModelSpec& model, const ParallelPlan& plan, const Profile& profile,
                              const Topology& topology, CostSources& sources) {
  const std::vector<GroupRoutes> routes = pipeline_group_routes(plan, topology);
  // Layer costs per pipeline rank; ranks whose groups route alike share one computation.
  std::vector<LayerCosts> layers_of_rank;
  for (std::size_t rank = 0; rank < routes.size(); ++rank) {
    std::size_t alike = 0;
    while (alike < rank && !same_routes(routes[alike], routes[rank])) ++alike;
    layers_of_rank.push_back(alike < rank ? layers_of_rank[alike]
                                          : transformer_layer_costs(model, plan, profile, routes[rank], sources));
  }
  const int64_t t = plan.tensor_parallel_size;
  const int64_t pp = plan.pipeline_parallel_size;
  const int64_t tokens = tokens_per_microbatch(model, plan);
  const int64_t h = model.hidden_size;
  const int64_t layers = layers_per_virtual_stage(model, plan);
  const int64_t num_stages = plan.num_virtual_stages();
  const StagePlacement placement = stage_placement(plan.schedule);
  const auto routes_of_stage = [&](int64_t stage) -> const GroupRoutes& {
    return routes[static_cast<std::size_t>(pipeline_rank_of_stage(stage, pp, placement))];
  };
  const int64_t activation_bytes = kBf16 * tokens * h;

  ActionCosts costs;
  costs.stages.resize(static_cast<std::size_t>(num_stages));
  for (int64_t index = 0; index < num_stages; ++index) {
    StageCosts& stage = costs.stages[static_cast<std::size_t>(index)];
    const LayerCosts& layer = layers_of_rank[static_cast<std::size_t>(pipeline_rank_of_stage(index, pp, placement))];
    stage.forward = static_cast<double>(layers) * layer.forward;
    stage.backward_input = static_cast<double>(layers) * layer.backward_input;
    stage.backward_weight = static_cast<double>(layers) * layer.backward_weight;
    stage.forward_collectives = static_cast<double>(layers) * layer.forward_collectives;
    stage.backward_collectives = static_cast<double>(layers) * layer.backward_collectives;
  }

  // Embedding lookup on the first stage; vocabulary-parallel, so tp ranks combine their rows.
  StageCosts& first = costs.stages.front();
  const CollectiveCoster first_tensor(profile, routes_of_stage(0).tensor, t, sources);
  const double embedding_combine = plan.sequence_parallel ? first_tensor(CollectiveOp::kReduceScatter, activation_bytes)
                                                          : first_tensor(CollectiveOp::kAllReduce, activation_bytes);
  first.forward += profile.elementwise_seconds(2 * activation_bytes, sources) + embedding_combine;
  first.forward_collectives += embedding_combine;
  first.backward_weight += profile.elementwise_seconds(2 * activation_bytes, sources);  // scatter-add of rows

  // Output layer on the last stage.
  StageCosts& last = costs.stages.back();
  const LayerCosts head = output_layer_costs(model, plan, profile, routes_of_stage(num_stages - 1).tensor, sources);
  last.forward += head.forward;
  last.forward_collectives += head.forward_collectives;
  last.backward_input += head.backward_input;
  last.backward_collectives += head.backward_collectives;
  last.backward_weight += head.backward_weight;

  // Pipeline transfers: each tp rank sends its part (the sequence shard with SP, else the whole).
  const int64_t transfer_bytes = activation_bytes / (plan.sequence_parallel ? t : 1);
  const std::vector<int64_t> pipeline = decoder_ranks(plan).get_ranks("pp").front();  // a GPU per pipeline rank
  for (int64_t stage = 0; stage + 1 < num_stages; ++stage) {
    const int64_t from = pipeline_rank_of_stage(stage, pp, placement);
    const int64_t to = pipeline_rank_of_stage(stage + 1, pp, placement);
    if (from == to) continue;
    const Route route = topology.route(pipeline[static_cast<std::size_t>(from)], pipeline[static_cast<std::size_t>(to)]);
    const double seconds = profile.p2p_seconds(transfer_bytes, kind_of(route), params_of(route), sources);
    costs.stages[static_cast<std::size_t>(stage)].send_forward = seconds;
    costs.stages[static_cast<std::size_t>(stage) + 1].send_backward = seconds;
  }

  // Gradients (fp32) reduce over dp x cp in Megatron's buckets; the distributed optimizer
  // reduce-scatters them and all-gathers the updated bf16 parameters after its step.
  const int64_t replicas = plan.data_parallel_size * plan.context_parallel_size;
  const CollectiveOp reduction = plan.use_distributed_optimizer ? CollectiveOp::kReduceScatter : CollectiveOp::kAllReduce;
  const LayerParameters layer_parameters = transformer_layer_parameters(model);
  const std::vector<PipelineRankParameters> rank_parameters = parameters_per_pipeline_rank(model, plan);
  const int64_t bucket = gradient_bucket_parameters(plan.data_parallel_size);
  for (int64_t stage = 0; stage < num_stages; ++stage) {
    int64_t parameters = layers * layer_parameters.per_gpu(t);
    const int64_t rank = pipeline_rank_of_stage(stage, pp, placement);
    const PipelineRankParameters& holder = rank_parameters[static_cast<std::size_t>(rank)];
    // The embedding and output layer's parameters: what the rank holds beyond its layers.
    if (stage == 0 || stage == num_stages - 1) {
      const int64_t extra = holder.parameters_per_gpu - holder.num_layers * layer_parameters.per_gpu(t);
      const bool both_ends_here = pipeline_rank_of_stage(0, pp, placement) == pipeline_rank_of_stage(num_stages - 1, pp, placement);
      parameters += both_ends_here && num_stages > 1 ? extra / 2 : extra;
    }
    std::vector<double>& buckets = costs.stages[static_cast<std::size_t>(stage)].gradient_buckets;
    if (replicas <= 1) continue;
    const CollectiveCoster data(profile, routes_of_stage(stage).data, replicas, sources);
    for (int64_t done = 0; done < parameters; done += bucket) {
      buckets.push_back(data(reduction, kFp32 * std::min(bucket, parameters - done)));
    }
  }

  costs.optimizer.resize(static_cast<std::size_t>(pp));
  for (int64_t rank = 0; rank < pp; ++rank) {
    costs.optimizer[static_cast<std::size_t>(rank)] =
        optimizer_step_seconds(plan, rank_parameters[static_cast<std::size_t>(rank)].parameters_per_gpu, profile,
                               routes[static_cast<std::size_t>(rank)].data, sources);
  }
  return costs;
}

}  // namespace megaplan::sim
