// Kernel lists per layer and per stage, costed by the profile.
#include "simulator/stage_costs.h"

#include <algorithm>
#include <array>
#include <iterator>
#include <limits>
#include <optional>
#include <tuple>
#include <utility>

#include "core/action_work.h"
#include "core/formulas.h"
#include "core/kernel_list.h"
#include "core/layer_recipe.h"
#include "core/pipeline_layout.h"
#include "core/rank_groups.h"

namespace megaplan::sim {

namespace {

constexpr int64_t kBf16 = 2;

LinkKind kind_of(const Route& route) { return route.crosses_nodes ? LinkKind::kNetwork : LinkKind::kNvlink; }
LinkParams params_of(const Route& route) { return {route.bandwidth_bytes_per_s, route.latency_s}; }

// The profile's answer for each distinct kernel of one plan's lists, asked once: a layer's blocks
// share most of their kernels, and the ring's steps repeat theirs (the profile's own memo is shared
// by a search's threads, behind a lock). Each use counts its lookup's sources as a lookup of its
// own would.
class KernelCosts {
 public:
  KernelCosts(const Profile& profile, CostSources& sources) : profile_(profile), sources_(sources) {}
  double operator()(const Kernel& kernel) {
    auto entry = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.kernel == kernel; });
    if (entry == entries_.end()) {
      entries_.push_back({kernel, 0, {}});
      entry = std::prev(entries_.end());
      entry->seconds = profile_.kernel_seconds(kernel, entry->sources);
    }
    sources_.table += entry->sources.table;
    sources_.fallback += entry->sources.fallback;
    return entry->seconds;
  }
  double operator()(const std::vector<Kernel>& kernels) {
    double seconds = 0;
    for (const Kernel& kernel : kernels) seconds += (*this)(kernel);
    return seconds;
  }
  const Profile& profile() const { return profile_; }
  CostSources& sources() { return sources_; }

 private:
  struct Entry {
    Kernel kernel;
    double seconds;
    CostSources sources;
  };
  const Profile& profile_;
  CostSources& sources_;
  std::vector<Entry> entries_;
};

// Seconds of every block of the plan's kernel list.
using BlockSeconds = std::array<double, kNumKernelBlocks>;

BlockSeconds cost_blocks(const PlanKernels& kernels, KernelCosts& costs) {
  BlockSeconds seconds{};
  for (std::size_t b = 0; b < kNumKernelBlocks; ++b) seconds[b] = costs(kernels.block(static_cast<KernelBlock>(b)));
  return seconds;
}

double part_seconds(const PlanKernels& kernels, const BlockSeconds& seconds, int64_t stage, SchedulePart part) {
  double total = 0;
  for (const CountedBlock& counted : kernels.stage_blocks(stage, part)) {
    total += static_cast<double>(counted.count) * seconds[static_cast<std::size_t>(counted.block)];
  }
  return total;
}

// Layers of a virtual stage of `num_layers` that full recomputation runs forward again in the backward.
int64_t recomputed_layers(const ParallelPlan& plan, int64_t num_layers) {
  int64_t recomputed = 0;
  for (const LayerGroup& group : recompute_groups(plan, num_layers))
    recomputed += group.recomputed ? group.num_layers : 0;
  return recomputed;
}

// Of those, the MoE layers of virtual stage `stage`.
int64_t recomputed_moe_layers(const ModelSpec& model, const ParallelPlan& plan, int64_t stage) {
  const StageLayers held = stage_layers(stage, model, plan);
  int64_t recomputed = 0;
  for (const LayerGroup& group : recompute_groups(plan, held.num_layers)) {
    if (group.recomputed) recomputed += model.moe.moe_layers(held.first_layer + group.first_layer, group.num_layers);
  }
  return recomputed;
}

class CollectiveCoster {
 public:
  CollectiveCoster(const Profile& profile, const Route& route, int64_t group_size, CostSources& sources)
      : profile_(profile), route_(route), group_size_(group_size), sources_(sources) {}
  double operator()(CollectiveOp op, int64_t bytes) const {
    if (group_size_ <= 1) return 0;
    return profile_.collective_seconds(op, group_size_, bytes, kind_of(route_), params_of(route_), sources_);
  }
  // What `op` on this group and compute beside it cost each other (Profile::overlap_slowdown).
  OverlapSlowdown overlap(CollectiveOp op) const {
    return group_size_ <= 1 ? OverlapSlowdown{} : profile_.overlap_slowdown(op, group_size_, kind_of(route_));
  }

 private:
  const Profile& profile_;
  const Route route_;
  const int64_t group_size_;
  CostSources& sources_;
};

Route slower(const Route& a, const Route& b) {
  if (a.bandwidth_bytes_per_s != b.bandwidth_bytes_per_s)
    return a.bandwidth_bytes_per_s < b.bandwidth_bytes_per_s ? a : b;
  return a.latency_s >= b.latency_s ? a : b;
}

bool same_routes(const GroupRoutes& a, const GroupRoutes& b) {
  const auto same = [](const Route& x, const Route& y) {
    return x.bandwidth_bytes_per_s == y.bandwidth_bytes_per_s && x.latency_s == y.latency_s &&
           x.crosses_nodes == y.crosses_nodes;
  };
  return same(a.tensor, b.tensor) && same(a.context, b.context) && same(a.data, b.data) && same(a.expert, b.expert) &&
         same(a.expert_data, b.expert_data) && same(a.expert_tensor, b.expert_tensor);
}

RankGenerator decoder_ranks(const ParallelPlan& plan) {
  return RankGenerator("decoder", plan.tensor_parallel_size, 1, plan.data_parallel_size, plan.pipeline_parallel_size,
                       plan.context_parallel_size, std::string(kDefaultParallelOrder));
}

}  // namespace

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
  std::vector<GroupRoutes> routes(static_cast<std::size_t>(plan.pipeline_parallel_size),
                                  GroupRoutes{none, none, none, none, none, none});
  const auto add = [&](const RankGenerator& generator, const char* token, Route GroupRoutes::*member) {
    for (const std::vector<int64_t>& group : generator.get_ranks(token)) {
      Route& slowest = routes[pipeline_rank[static_cast<std::size_t>(group.front())]].*member;
      slowest = slower(slowest, topology.ring_route(group));
    }
  };
  add(ranks, "tp", &GroupRoutes::tensor);
  add(ranks, "cp", &GroupRoutes::context);
  add(ranks, "dp-cp", &GroupRoutes::data);
  // The expert layers' generator (their pipeline groups are the same) where their groups differ.
  if (plan.expert_groups_apart()) {
    const RankGenerator experts("expert", plan.expert_tensor_parallel(), plan.expert_model_parallel_size,
                                plan.expert_data_parallel_size(), plan.pipeline_parallel_size, 1,
                                std::string(kDefaultParallelOrder));
    add(experts, "ep", &GroupRoutes::expert);
    add(experts, "dp", &GroupRoutes::expert_data);
    add(experts, "tp", &GroupRoutes::expert_tensor);
  } else {
    for (GroupRoutes& rank : routes) {  // the experts' replicas and cut are the others'
      rank.expert_data = rank.data;
      rank.expert_tensor = rank.tensor;
    }
  }
  return routes;
}

namespace {

// A layer's collectives on the critical path, per microbatch: forward and backward (B and I alike).
struct LayerCollectives {
  double forward = 0;
  double backward = 0;
  double forward_again = 0;  // full recomputation's forward (an MoE layer's logs nothing)
  double weight = 0;         // W: the inputs of its weight GEMMs gathered again (sequence parallelism)
};

// The GEMMs --tp-comm-overlap runs each sequence-parallel collective beside (Transformer Engine's
// userbuffers): forward, the all-gather before QKV and fc1 and the reduce-scatter after the
// projection and fc2; backward, the all-gather of fc2's and the projection's output gradient
// beside their input-gradient GEMMs and the reduce-scatter of fc1's and QKV's input gradient
// beside their weight-gradient GEMMs. Seconds of each, in that order: AG, RS, AG, RS.
struct OverlapGemms {
  std::array<double, 4> forward{};
  std::array<double, 4> backward{};
};

double gemm_seconds_in(const std::vector<Kernel>& block, GemmLayout layout, int64_t n, int64_t k, KernelCosts& costs) {
  for (const Kernel& kernel : block) {
    if (kernel.kind == KernelKind::kGemm && kernel.batch <= 1 && kernel.layout == layout && kernel.n == n &&
        kernel.k == k) {
      return costs(kernel);
    }
  }
  return 0;
}

OverlapGemms overlap_gemms(const ModelSpec& model, const ParallelPlan& plan, const PlanKernels& kernels,
                           KernelCosts& costs) {
  const LayerDims dims = layer_dims(model, plan);
  const int64_t h = dims.hidden, q = dims.query, qkv = dims.qkv, f = dims.ffn, fc1 = dims.fc1;
  const std::vector<Kernel>& forward = kernels.block(KernelBlock::kLayerForward);
  const std::vector<Kernel>& backward = kernels.block(KernelBlock::kLayerBackward);
  const auto seconds = [&](const std::vector<Kernel>& block, GemmLayout layout, int64_t n, int64_t k) {
    return gemm_seconds_in(block, layout, n, k, costs);
  };
  OverlapGemms gemms;
  gemms.forward = {seconds(forward, GemmLayout::kForward, qkv, h), seconds(forward, GemmLayout::kForward, h, q),
                   seconds(forward, GemmLayout::kForward, fc1, h), seconds(forward, GemmLayout::kForward, h, f)};
  gemms.backward = {
      seconds(backward, GemmLayout::kInputGradient, h, f), seconds(backward, GemmLayout::kWeightGradient, fc1, h),
      seconds(backward, GemmLayout::kInputGradient, h, q), seconds(backward, GemmLayout::kWeightGradient, qkv, h)};
  return gemms;
}

// Tensor parallelism's collectives in a layer: its attention's and, `dense_mlp`, its dense MLP's
// (an MoE layer's MLP lists its own: moe_layer_collectives).
LayerCollectives layer_collectives(const ModelSpec& model, const ParallelPlan& plan, const Profile& profile,
                                   const GroupRoutes& routes, const OverlapGemms* overlap, CostSources& sources,
                                   bool dense_mlp) {
  const int64_t t = plan.tensor_parallel_size;
  const int64_t tokens = tokens_per_microbatch(model, plan);
  // Tensor parallelism: two all-reduces of the layer's output per pass, or with sequence
  // parallelism two all-gathers and two reduce-scatters of the same tensor; with --tp-comm-overlap
  // what each one's GEMM does not cover, and what the GEMM loses to it (exposed_beside).
  const CollectiveCoster tensor(profile, routes.tensor, t, sources);
  const int64_t activation_bytes = kBf16 * tokens * model.hidden_size;
  const std::size_t branches = dense_mlp ? 2 : 1;
  LayerCollectives collectives;
  if (!plan.sequence_parallel) {
    collectives.forward = collectives.backward =
        static_cast<double>(branches) * tensor(CollectiveOp::kAllReduce, activation_bytes);
  } else {
    const double gather = tensor(CollectiveOp::kAllGather, activation_bytes);
    const double scatter = tensor(CollectiveOp::kReduceScatter, activation_bytes);
    const std::array<double, 4> sequence = {gather, scatter, gather, scatter};
    const OverlapSlowdown gather_overlap = tensor.overlap(CollectiveOp::kAllGather);
    const OverlapSlowdown scatter_overlap = tensor.overlap(CollectiveOp::kReduceScatter);
    const std::array<OverlapSlowdown, 4> slowdown = {gather_overlap, scatter_overlap, gather_overlap, scatter_overlap};
    for (std::size_t i = 0; i < 2 * branches; ++i) {
      collectives.forward += overlap ? exposed_beside(sequence[i], overlap->forward[i], slowdown[i]) : sequence[i];
      collectives.backward += overlap ? exposed_beside(sequence[i], overlap->backward[i], slowdown[i]) : sequence[i];
    }
    // W gathers the rows of each column-parallel GEMM's input again (QKV's, and the dense fc1's),
    // waiting for each.
    collectives.weight = static_cast<double>(branches) * gather;
  }
  return collectives;
}

// What one pass of context parallelism's ring adds to its kernels' time (kernel_list.h's
// RingAttention): each step's exchange with its neighbours runs beside that step's kernels, which
// hide what they can of it and lose what the two cost each other; what the last step sends home
// waits alone. The exchanges go to the next rank and come from the previous one at once, over the
// group's slowest route.
double ring_exposed(const RingAttention& ring, const Route& route, KernelCosts& costs) {
  const Profile& profile = costs.profile();
  const OverlapSlowdown slowdown = profile.p2p_overlap_slowdown(kind_of(route));
  const auto exchange = [&](int64_t bytes) {
    return bytes > 0 ? profile.p2p_seconds(bytes, kind_of(route), params_of(route), costs.sources()) : 0.0;
  };
  double exposed = exchange(ring.trailing_bytes);
  for (const RingAttention::Step& step : ring.steps) {
    if (step.exchanged_bytes > 0)
      exposed += exposed_beside(exchange(step.exchanged_bytes), costs(step.kernels), slowdown);
  }
  return exposed;
}

// A layer's tensor- and context-parallel collectives (`dense_mlp`: with its dense MLP's).
LayerCollectives plan_layer_collectives(const ModelSpec& model, const ParallelPlan& plan, const PlanKernels& kernels,
                                        const GroupRoutes& routes, KernelCosts& costs, bool dense_mlp = true) {
  LayerCollectives collectives;
  if (plan.tensor_parallel_size > 1) {
    std::optional<OverlapGemms> overlap;
    if (overlaps_tensor_parallel_communication(plan)) overlap = overlap_gemms(model, plan, kernels, costs);
    collectives = layer_collectives(model, plan, costs.profile(), routes, overlap ? &*overlap : nullptr,
                                    costs.sources(), dense_mlp);
  }
  if (plan.context_parallel_size > 1) {
    const double forward = ring_exposed(kernels.ring().forward, routes.context, costs);
    collectives.forward += forward;
    collectives.backward += ring_exposed(kernels.ring().backward, routes.context, costs);
    // Selective recomputation runs every layer's attention core, its ring included, again before
    // the layer's backward.
    if (plan.recompute_granularity == RecomputeGranularity::kSelective) collectives.backward += forward;
  }
  collectives.forward_again = collectives.forward;
  return collectives;
}

// An MoE layer's collectives: its attention's (plan_layer_collectives without a dense MLP) and its
// MLP's over the ep, tp and cp groups as core/moe_kernel_list.h lists them, none of them overlapped
// (the executor waits for each).
LayerCollectives moe_layer_collectives(const ModelSpec& model, const ParallelPlan& plan, const PlanKernels& kernels,
                                       const GroupRoutes& routes, KernelCosts& costs) {
  LayerCollectives collectives = plan_layer_collectives(model, plan, kernels, routes, costs, false);
  const CollectiveCoster expert(costs.profile(), routes.expert, plan.expert_model_parallel_size, costs.sources());
  const CollectiveCoster tensor(costs.profile(), routes.tensor, plan.tensor_parallel_size, costs.sources());
  const CollectiveCoster context(costs.profile(), routes.context, plan.context_parallel_size, costs.sources());
  const CollectiveCoster expert_tensor(costs.profile(), routes.expert_tensor, plan.expert_tensor_parallel(),
                                       costs.sources());
  const auto seconds = [&](const std::vector<MoeCollective>& list) {
    double total = 0;
    for (const MoeCollective& c : list) {
      const CollectiveCoster& group = c.group == MoeGroup::kExpert         ? expert
                                      : c.group == MoeGroup::kTensor       ? tensor
                                      : c.group == MoeGroup::kExpertTensor ? expert_tensor
                                                                           : context;
      total += group(c.op, c.bytes);
    }
    return total;
  };
  collectives.forward_again = collectives.forward + seconds(kernels.moe().forward_again_collectives);
  collectives.forward += seconds(kernels.moe().forward_collectives);
  collectives.backward += seconds(kernels.moe().backward_collectives);
  collectives.weight += seconds(kernels.moe().weight_collectives);
  return collectives;
}

// The output layer's collectives: with sequence parallelism its input is all-gathered in the
// forward and its input gradient reduce-scattered; without, that gradient is all-reduced.
LayerCollectives head_collectives(const ModelSpec& model, const ParallelPlan& plan, const Profile& profile,
                                  const Route& tensor_route, CostSources& sources) {
  const CollectiveCoster tensor(profile, tensor_route, plan.tensor_parallel_size, sources);
  const int64_t activation_bytes = kBf16 * tokens_per_microbatch(model, plan) * model.hidden_size;
  if (plan.sequence_parallel) {
    return {tensor(CollectiveOp::kAllGather, activation_bytes), tensor(CollectiveOp::kReduceScatter, activation_bytes)};
  }
  return {0, tensor(CollectiveOp::kAllReduce, activation_bytes)};
}

}  // namespace

LayerCosts transformer_layer_costs(const ModelSpec& model, const ParallelPlan& plan, const Profile& profile,
                                   const GroupRoutes& routes, CostSources& sources, bool moe_layer) {
  if (moe_layer && !model.moe.enabled()) throw std::logic_error("transformer_layer_costs: no MoE layer in the model");
  const PlanKernels kernels(model, plan);
  KernelCosts costs(profile, sources);
  const BlockSeconds blocks = cost_blocks(kernels, costs);
  const auto seconds = [&](KernelBlock block) { return blocks[static_cast<std::size_t>(block)]; };
  const LayerCollectives collectives = moe_layer ? moe_layer_collectives(model, plan, kernels, routes, costs)
                                                 : plan_layer_collectives(model, plan, kernels, routes, costs);
  LayerCosts layer;
  layer.forward_collectives = collectives.forward;
  layer.backward_collectives = collectives.backward;
  layer.forward =
      (moe_layer ? std::min(seconds(KernelBlock::kMoeLayerForwardFirst), seconds(KernelBlock::kMoeLayerForward))
                 : std::min(seconds(KernelBlock::kLayerForwardFirst), seconds(KernelBlock::kLayerForward))) +
      collectives.forward;
  // Full recomputation's forward again: an MoE layer's adds nothing to the router losses' log.
  const double forward_again =
      moe_layer ? std::min(seconds(KernelBlock::kMoeLayerRecomputeFirst), seconds(KernelBlock::kMoeLayerRecompute)) +
                      collectives.forward_again
                : layer.forward;
  // Recomputation repeats forward work inside the backward: the attention core (selective) or,
  // per average layer of a stage, the fraction of layers --recompute-method runs forward again
  // with their collectives (full).
  double recompute = 0;
  if (plan.recompute_granularity == RecomputeGranularity::kSelective) {
    recompute = seconds(KernelBlock::kAttentionRecompute);
  } else if (plan.recompute_granularity == RecomputeGranularity::kFull) {
    // Over the whole model: uneven stages recompute different shares.
    int64_t recomputed = 0;
    for (const int64_t layers : stage_layer_counts(model, plan)) recomputed += recomputed_layers(plan, layers);
    const double fraction = static_cast<double>(recomputed) / static_cast<double>(model.num_layers);
    recompute = fraction * forward_again;
    layer.backward_collectives += fraction * collectives.forward_again;
  }
  layer.backward = seconds(moe_layer ? KernelBlock::kMoeLayerBackward : KernelBlock::kLayerBackward) + recompute +
                   collectives.backward;
  layer.backward_input = seconds(moe_layer ? KernelBlock::kMoeLayerBackwardInput : KernelBlock::kLayerBackwardInput) +
                         recompute + collectives.backward;
  layer.backward_weight =
      seconds(moe_layer ? KernelBlock::kMoeLayerWeightGradient : KernelBlock::kLayerWeightGradient) +
      collectives.weight;
  return layer;
}

LayerCosts output_layer_costs(const ModelSpec& model, const ParallelPlan& plan, const Profile& profile,
                              const Route& tensor_route, CostSources& sources) {
  const PlanKernels kernels(model, plan);
  KernelCosts costs(profile, sources);
  const auto seconds = [&](KernelBlock block) { return costs(kernels.block(block)); };
  const LayerCollectives collectives = head_collectives(model, plan, profile, tensor_route, sources);
  LayerCosts head;
  head.forward_collectives = collectives.forward;
  head.backward_collectives = collectives.backward;
  head.forward = seconds(KernelBlock::kHeadForward) + collectives.forward;
  head.backward = seconds(KernelBlock::kHeadBackward) + collectives.backward;
  head.backward_input = seconds(KernelBlock::kHeadBackwardInput) + collectives.backward;
  head.backward_weight = seconds(KernelBlock::kHeadWeightGradient);
  return head;
}

double optimizer_step_seconds(const ParallelPlan& plan, int64_t parameters_per_gpu, const Profile& profile,
                              const Route& data_route, CostSources& sources, int64_t expert_parameters_per_gpu,
                              const Route* expert_data_route) {
  double seconds = 0;
  for (const Kernel& kernel : optimizer_step_kernels(plan, parameters_per_gpu, expert_parameters_per_gpu)) {
    seconds += profile.kernel_seconds(kernel, sources);
  }
  const int64_t replicas = plan.gradient_group_size();
  if (!plan.use_distributed_optimizer || (replicas <= 1 && plan.expert_data_parallel_size() <= 1)) return seconds;
  if (expert_parameters_per_gpu > 0) {
    // The experts' updated parameters gather over expert dp, after the others' (not overlapped:
    // --overlap-param-gather is the dense buckets').
    const CollectiveCoster expert_data(profile, expert_data_route ? *expert_data_route : data_route,
                                       plan.expert_data_parallel_size(), sources);
    seconds += expert_data(CollectiveOp::kAllGather, kBf16 * expert_parameters_per_gpu);
    parameters_per_gpu -= expert_parameters_per_gpu;
  }
  if (replicas <= 1) return seconds;
  // The updated bf16 parameters gathered over dp x cp; --overlap-param-gather issues the gathers
  // bucket by bucket and waits for each in the next forward, so only the first bucket's is exposed,
  // and the forward it runs beside loses what the others take from it (exposed_beside, the forward
  // outlasting them).
  const CollectiveCoster data(profile, data_route, replicas, sources);
  const double all = data(CollectiveOp::kAllGather, kBf16 * parameters_per_gpu);
  if (!overlaps_parameter_gather(plan)) return seconds + all;
  const double first =
      data(CollectiveOp::kAllGather, kBf16 * std::min(parameters_per_gpu, gradient_bucket_parameters(plan)));
  const double covered = all - first;
  const double forward_outlasts = std::numeric_limits<double>::infinity();
  return seconds + first + exposed_beside(covered, forward_outlasts, data.overlap(CollectiveOp::kAllGather));
}

ActionCosts plan_action_costs(const ModelSpec& model, const ParallelPlan& plan, const Profile& profile,
                              const Topology& topology, CostSources& sources) {
  const std::vector<GroupRoutes> routes = pipeline_group_routes(plan, topology);
  const PlanKernels kernels(model, plan);
  KernelCosts kernel_costs(profile, sources);
  const BlockSeconds blocks = cost_blocks(kernels, kernel_costs);
  // Layer collectives per pipeline rank, and an MoE layer's exchanges; ranks whose groups route alike
  // share one computation.
  std::vector<LayerCollectives> collectives_of_rank, moe_collectives_of_rank;
  for (std::size_t rank = 0; rank < routes.size(); ++rank) {
    std::size_t alike = 0;
    while (alike < rank && !same_routes(routes[alike], routes[rank])) ++alike;
    if (alike < rank) {
      collectives_of_rank.push_back(collectives_of_rank[alike]);
      moe_collectives_of_rank.push_back(moe_collectives_of_rank[alike]);
      continue;
    }
    collectives_of_rank.push_back(plan_layer_collectives(model, plan, kernels, routes[rank], kernel_costs));
    moe_collectives_of_rank.push_back(model.moe.enabled()
                                          ? moe_layer_collectives(model, plan, kernels, routes[rank], kernel_costs)
                                          : LayerCollectives{});
  }
  const int64_t t = plan.tensor_parallel_size;
  const int64_t pp = plan.pipeline_parallel_size;
  const int64_t tokens = tokens_per_microbatch(model, plan);
  const int64_t h = model.hidden_size;
  const std::vector<int64_t> stage_layers = stage_layer_counts(model, plan);
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
    const auto rank = static_cast<std::size_t>(pipeline_rank_of_stage(index, pp, placement));
    const LayerCollectives& layer = collectives_of_rank[rank];
    const LayerCollectives& moe = moe_collectives_of_rank[rank];
    const int64_t layers = stage_layers[static_cast<std::size_t>(index)];
    const int64_t recomputed = recomputed_layers(plan, layers);
    const auto recomputed_moe =
        static_cast<double>(model.moe.enabled() ? recomputed_moe_layers(model, plan, index) : 0);
    double moe_layers = 0;
    if (model.moe.enabled()) {
      const StageLayers held = megaplan::stage_layers(index, model, plan);
      moe_layers = static_cast<double>(model.moe.moe_layers(held.first_layer, held.num_layers));
    }
    const double dense_layers = static_cast<double>(layers) - moe_layers;
    stage.forward_collectives = dense_layers * layer.forward + moe_layers * moe.forward;
    stage.backward_collectives = dense_layers * layer.backward + moe_layers * moe.backward +
                                 (static_cast<double>(recomputed) - recomputed_moe) * layer.forward +
                                 recomputed_moe * moe.forward_again;
    stage.forward = part_seconds(kernels, blocks, index, SchedulePart::kForward) + stage.forward_collectives;
    stage.backward = part_seconds(kernels, blocks, index, SchedulePart::kBackward) + stage.backward_collectives;
    stage.backward_input =
        part_seconds(kernels, blocks, index, SchedulePart::kBackwardInput) + stage.backward_collectives;
    stage.weight_collectives = dense_layers * layer.weight + moe_layers * moe.weight;
    stage.backward_weight =
        part_seconds(kernels, blocks, index, SchedulePart::kBackwardWeight) + stage.weight_collectives;
  }

  // The embedding is vocabulary-parallel: tp ranks combine their rows.
  StageCosts& first = costs.stages.front();
  const CollectiveCoster first_tensor(profile, routes_of_stage(0).tensor, t, sources);
  const double embedding_combine = plan.sequence_parallel ? first_tensor(CollectiveOp::kReduceScatter, activation_bytes)
                                                          : first_tensor(CollectiveOp::kAllReduce, activation_bytes);
  first.forward += embedding_combine;
  first.forward_collectives += embedding_combine;

  // The output layer's collectives on the last stage.
  StageCosts& last = costs.stages.back();
  const LayerCollectives head = head_collectives(model, plan, profile, routes_of_stage(num_stages - 1).tensor, sources);
  last.forward += head.forward;
  last.forward_collectives += head.forward;
  for (double* part : {&last.backward, &last.backward_input, &last.backward_collectives}) *part += head.backward;

  // Pipeline transfers: each tp rank sends its part (the sequence shard with SP, else the whole);
  // Megatron's scatter-gather sends 1/tp of the whole and the receiving tp group all-gathers it.
  const bool scattered = scatters_pipeline_transfers(plan);
  const int64_t transfer_bytes = pipeline_message_bytes(model, plan);
  const std::vector<int64_t> pipeline = decoder_ranks(plan).get_ranks("pp").front();  // a GPU per pipeline rank
  for (int64_t stage = 0; stage + 1 < num_stages; ++stage) {
    const int64_t from = pipeline_rank_of_stage(stage, pp, placement);
    const int64_t to = pipeline_rank_of_stage(stage + 1, pp, placement);
    if (from == to) continue;
    const Route route =
        topology.route(pipeline[static_cast<std::size_t>(from)], pipeline[static_cast<std::size_t>(to)]);
    const double seconds = profile.p2p_seconds(transfer_bytes, kind_of(route), params_of(route), sources);
    costs.stages[static_cast<std::size_t>(stage)].send_forward = seconds;
    costs.stages[static_cast<std::size_t>(stage) + 1].send_backward = seconds;
    if (!scattered) continue;
    StageCosts& receiver = costs.stages[static_cast<std::size_t>(stage) + 1];
    const double forward_gather = CollectiveCoster(profile, routes_of_stage(stage + 1).tensor, t, sources)(
        CollectiveOp::kAllGather, activation_bytes);
    receiver.forward += forward_gather;
    receiver.forward_collectives += forward_gather;
    StageCosts& sender = costs.stages[static_cast<std::size_t>(stage)];
    const double backward_gather = CollectiveCoster(profile, routes_of_stage(stage).tensor, t, sources)(
        CollectiveOp::kAllGather, activation_bytes);
    for (double* part : {&sender.backward, &sender.backward_input, &sender.backward_collectives})
      *part += backward_gather;
  }

  // Gradients (fp32, or fp16 where the implementation keeps them so) reduce over dp x cp in
  // Megatron's buckets, during the backward with --overlap-grad-reduce and after it without; the
  // distributed optimizer reduce-scatters them and all-gathers the updated parameters after its step.
  costs.overlapped_gradient_reduction = overlaps_gradient_reduction(plan);
  const int64_t gradient_bytes = main_gradient_bytes(plan.options);
  const int64_t replicas = plan.gradient_group_size();
  const CollectiveOp reduction =
      plan.use_distributed_optimizer ? CollectiveOp::kReduceScatter : CollectiveOp::kAllReduce;
  const std::vector<PipelineRankParameters> rank_parameters = parameters_per_pipeline_rank(model, plan);
  const int64_t bucket = gradient_bucket_parameters(plan);
  const int64_t expert_replicas = model.moe.enabled() ? plan.expert_data_parallel_size() : 1;
  for (int64_t stage = 0; stage < num_stages; ++stage) {
    // Nothing to sum where every gradient has one replica (whole experts on each tp rank of one
    // replica have several: the tp group's rows).
    if (replicas <= 1 && expert_replicas <= 1) continue;
    const StageParameters held = stage_parameters(model, plan, stage);
    std::vector<GradientBucketCost>& buckets = costs.stages[static_cast<std::size_t>(stage)].gradient_buckets;
    const CollectiveCoster data(profile, routes_of_stage(stage).data, replicas, sources);
    costs.stages[static_cast<std::size_t>(stage)].gradient_reduction_overlap = data.overlap(reduction);
    // Buckets of the others fill as the backward goes; the word embedding has a bucket of its own
    // (core's stage_layout), whole only at the backward's end.
    // The routed experts' gradients sum in buckets of their own over expert dp (none when each
    // rank holds its experts alone); both kinds fill at the pace of the backward, in order of readiness.
    const CollectiveCoster expert_data(profile, routes_of_stage(stage).expert_data, plan.expert_data_parallel_size(),
                                       sources);
    const int64_t filling = held.parameters_per_gpu - held.word_embedding_per_gpu - held.expert_per_gpu;
    for (const auto& [parameters, group, members] :
         {std::tuple{filling, &data, replicas}, std::tuple{held.expert_per_gpu, &expert_data, expert_replicas}}) {
      if (members <= 1) continue;
      for (int64_t done = 0; done < parameters; done += bucket) {
        const int64_t size = std::min(bucket, parameters - done);
        buckets.push_back({(*group)(reduction, gradient_bytes * size),
                           static_cast<double>(done + size) / static_cast<double>(parameters)});
      }
    }
    std::stable_sort(buckets.begin(), buckets.end(),
                     [](const GradientBucketCost& a, const GradientBucketCost& b) { return a.ready < b.ready; });
    if (held.word_embedding_per_gpu > 0 && replicas > 1) {
      buckets.push_back({data(reduction, gradient_bytes * held.word_embedding_per_gpu), 1});
    }
  }

  costs.optimizer.resize(static_cast<std::size_t>(pp));
  for (int64_t rank = 0; rank < pp; ++rank) {
    const PipelineRankParameters& held = rank_parameters[static_cast<std::size_t>(rank)];
    const GroupRoutes& rank_routes = routes[static_cast<std::size_t>(rank)];
    costs.optimizer[static_cast<std::size_t>(rank)] =
        optimizer_step_seconds(plan, held.parameters_per_gpu, profile, rank_routes.data, sources, held.expert_per_gpu,
                               &rank_routes.expert_data);
  }

  // Aux-loss-free balancing before the step: each chunk's counts of its MoE layers summed over tp,
  // then dp x cp (as the executor's optimizer does), and one update a layer.
  if (model.moe.enabled() && model.moe.router_enable_expert_bias) {
    for (int64_t stage = 0; stage < num_stages; ++stage) {
      const StageLayers layers = megaplan::stage_layers(stage, model, plan);
      const int64_t moe_layers = model.moe.moe_layers(layers.first_layer, layers.num_layers);
      if (moe_layers == 0) continue;
      const int64_t rank = pipeline_rank_of_stage(stage, pp, placement);
      const GroupRoutes& rank_routes = routes[static_cast<std::size_t>(rank)];
      const int64_t bytes = kFp32 * moe_layers * model.moe.num_experts;
      double seconds = CollectiveCoster(profile, rank_routes.tensor, t, sources)(CollectiveOp::kAllReduce, bytes) +
                       CollectiveCoster(profile, rank_routes.data, plan.gradient_group_size(), sources)(
                           CollectiveOp::kAllReduce, bytes);
      seconds += kernel_costs(expert_bias_kernels(model, moe_layers));
      costs.optimizer[static_cast<std::size_t>(rank)] += seconds;
    }
  }

  // Tied embeddings on two pipeline ranks: before the step, the word embedding's gradient and the
  // output layer's copy of it are all-reduced between the two (Megatron's embedding group).
  const int64_t first_rank = pipeline_rank_of_stage(0, pp, placement);
  const int64_t last_rank = pipeline_rank_of_stage(num_stages - 1, pp, placement);
  if (!model.untie_embeddings_and_output_weights && first_rank != last_rank) {
    const Route route =
        topology.route(pipeline[static_cast<std::size_t>(first_rank)], pipeline[static_cast<std::size_t>(last_rank)]);
    const int64_t bytes = gradient_bytes * (padded_vocab_size(model, t) / t) * h;
    const double seconds =
        profile.collective_seconds(CollectiveOp::kAllReduce, 2, bytes, kind_of(route), params_of(route), sources);
    costs.optimizer[static_cast<std::size_t>(first_rank)] += seconds;
    costs.optimizer[static_cast<std::size_t>(last_rank)] += seconds;
  }
  return costs;
}

}  // namespace megaplan::sim
