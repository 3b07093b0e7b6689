// The kernels the executor's GPT and Llama launch are core's kernel list (core/kernel_list.h), kernel for
// kernel and shape for shape, for F, B, I and W on every kind of stage, with each recomputation,
// on both tensor-parallel ranks with and without sequence parallelism, on every context-parallel
// rank (the ring step by step), and for the optimizer step:
// the list the simulator costs cannot drift from what runs. What a stage chunk allocates is what
// core's layer recipe lists (core/layer_recipe.h), buffer for buffer. And what the profiler
// launches for a listed kernel is that kernel.
#include <catch2/catch.hpp>

#include <algorithm>
#include <optional>
#include <random>
#include <stdexcept>
#include <tuple>

#include "core/formulas.h"
#include "core/kernel_list.h"
#include "core/layer_recipe.h"
#include "core/moe_kernel_list.h"
#include "core/pipeline_layout.h"
#include "executor/comm/in_process_comm.h"
#include "executor/comm/rank_threads.h"
#include "executor/model/stage_chunk.h"
#include "executor/runtime/kernel_launch.h"
#include "executor/train/optimizer.h"
#include "tests/executor/comm/recording_comm.h"
#include "tests/executor/runtime/recording_backend.h"
#include "tests/executor/train/training_fixtures.h"

namespace Catch {
template <>
struct StringMaker<megaplan::MoeCollective> {
  static std::string convert(const megaplan::MoeCollective& c) {
    const char* group = c.group == megaplan::MoeGroup::kExpert         ? "ep "
                        : c.group == megaplan::MoeGroup::kTensor       ? "tp "
                        : c.group == megaplan::MoeGroup::kExpertTensor ? "etp "
                                                                       : "cp ";
    return group + megaplan::to_string(c.op) + " " + std::to_string(c.bytes);
  }
};
}  // namespace Catch

namespace {

using megaplan::DType;
using megaplan::Kernel;
using megaplan::PlanKernels;
using megaplan::ScheduleKind;
using megaplan::SchedulePart;
using megaplan::exec::MicrobatchTokens;
using megaplan::exec::StageChunk;
using megaplan::test::four_layer_gpt;
using megaplan::test::four_layer_llama;
using megaplan::test::four_layer_qwen;
using megaplan::test::four_layer_qwen3;
using megaplan::test::layout;
using megaplan::test::RecordingBackend;

MicrobatchTokens microbatch(const megaplan::ModelSpec& model, int64_t batch) {
  std::mt19937 generator(5);
  std::uniform_int_distribution<int64_t> token(0, model.vocab_size - 1);
  MicrobatchTokens data;
  data.tokens.resize(static_cast<std::size_t>(batch * (model.seq_length + 1)));
  for (int64_t& t : data.tokens) t = token(generator);
  data.loss_mask.assign(static_cast<std::size_t>(batch * model.seq_length), 1.0f);
  return data;
}

std::string lines(const std::vector<Kernel>& kernels) {
  std::string text;
  for (const Kernel& kernel : kernels) text += "  " + megaplan::describe(kernel) + "\n";
  return text;
}

void check_same(const std::vector<Kernel>& launched, const std::vector<Kernel>& listed) {
  INFO("launched:\n" << lines(launched) << "listed:\n" << lines(listed));
  CHECK(launched == listed);
}

using Allocation = RecordingBackend::Allocation;

// Whether `expected` occur in `calls` in their order, other calls between them.
bool listed_in_order_among(const std::vector<megaplan::MoeCollective>& calls,
                           const std::vector<megaplan::MoeCollective>& expected) {
  auto at = calls.begin();
  for (const megaplan::MoeCollective& c : expected) {
    at = std::find(at, calls.end(), c);
    if (at == calls.end()) return false;
    ++at;
  }
  return true;
}

// The buffers a size struct of core's recipe lists.
template <typename Sizes>
std::vector<Allocation> recipe_buffers(const Sizes& sizes) {
  std::vector<Allocation> buffers;
  megaplan::for_each_buffer(sizes, [&](const auto& size) {
    using Size = std::decay_t<decltype(size)>;
    if (size.count > 0) buffers.push_back({std::is_same_v<Size, megaplan::ActivationElements>, size.count});
  });
  return buffers;
}

std::vector<Allocation> operator+(std::vector<Allocation> a, const std::vector<Allocation>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string lines(std::vector<Allocation> buffers) {
  std::sort(buffers.begin(), buffers.end());
  std::string text;
  for (const Allocation& buffer : buffers) {
    text += std::string("  ") + (buffer.activation ? "activation " : "fp32 ") + std::to_string(buffer.elements) + "\n";
  }
  return text;
}

// `made` must be `exact` and any number of whole `sets` besides (recomputation borrows whole layer
// sets from a pool, which may already hold some): nothing the recipe does not list.
void check_allocations(std::vector<Allocation> made, std::vector<Allocation> exact,
                       const std::vector<Allocation>& set = {}) {
  INFO("allocated:\n" << lines(made) << "listed:\n" << lines(exact) << "and any number of sets of:\n" << lines(set));
  if (made.size() > exact.size() && !set.empty()) {
    for (std::size_t extra = made.size() - exact.size(); extra >= set.size(); extra -= set.size()) exact = exact + set;
  }
  std::sort(made.begin(), made.end());
  std::sort(exact.begin(), exact.end());
  CHECK(made == exact);
}

// One stage's F then B on microbatch 0, and F, I and W on microbatch 1, each checked against the
// kernel list, and its allocations (its construction's included) against the layer recipe.
void check_stage(StageChunk& chunk, RecordingBackend& backend, const megaplan::ModelSpec& model,
                 const megaplan::ParallelPlan& plan, int64_t stage, const MicrobatchTokens* data, bool first,
                 bool last) {
  const PlanKernels list(model, plan, chunk.tensor_parallel_rank());
  const megaplan::LayerRecipe recipe(model, plan, megaplan::exec::executor_precision(backend));
  const auto fp32 = [](std::size_t n) { return Allocation{false, static_cast<int64_t>(n)}; };
  check_allocations(backend.take_allocations(), std::vector{fp32(chunk.layout().total), fp32(chunk.layout().total)} +
                                                    recipe_buffers(recipe.scratch(last)));
  const int64_t layers = megaplan::stage_layers(stage, model, plan).num_layers;
  std::vector<Allocation> microbatch_set = recipe_buffers(recipe.microbatch(last));
  for (const megaplan::LayerKeep keep : megaplan::layer_keeps(plan, megaplan::recompute_groups(plan, layers))) {
    microbatch_set = microbatch_set + recipe_buffers(recipe.kept(keep));
  }
  const std::vector<Allocation> pool_set = recipe_buffers(recipe.kept(megaplan::LayerKeep::kAll));
  std::vector<Allocation> deferred;
  for (int64_t l = 0; l < layers; ++l) deferred = deferred + recipe_buffers(recipe.deferred());
  if (first) deferred.push_back({true, recipe.deferred_embedding_gradient().count});

  const std::size_t n = chunk.message_size();
  megaplan::exec::Activation output_gradient = last ? nullptr : backend.allocate_activation(n);
  megaplan::exec::Activation input_gradient = first ? nullptr : backend.allocate_activation(n);
  for (const bool defer : {false, true}) {
    const int64_t microbatch = defer ? 1 : 0;
    backend.take_allocations();
    if (!first) (void)chunk.input_buffer(microbatch);
    backend.take();
    chunk.forward(microbatch, data);
    check_same(backend.take(), list.stage_kernels(stage, SchedulePart::kForward));
    // The first microbatch's set is allocated; the second reuses it.
    check_allocations(backend.take_allocations(), defer ? std::vector<Allocation>{} : microbatch_set, pool_set);
    chunk.backward_input(microbatch, output_gradient, 1.0f, input_gradient, defer);
    check_same(backend.take(),
               list.stage_kernels(stage, defer ? SchedulePart::kBackwardInput : SchedulePart::kBackward));
    check_allocations(backend.take_allocations(), defer ? deferred : std::vector<Allocation>{}, pool_set);
    if (defer) {
      chunk.backward_weight(microbatch);
      check_same(backend.take(), list.stage_kernels(stage, SchedulePart::kBackwardWeight));
      check_allocations(backend.take_allocations(), {});
    }
  }
  for (megaplan::exec::Activation buffer : {output_gradient, input_gradient}) {
    if (buffer) backend.release(buffer);
  }
}

}  // namespace

TEST_CASE("one stage launches its kernel list for F, B, I and W under each recomputation, with and without dropout",
          "[model][kernels]") {
  for (const megaplan::ModelSpec& model : {four_layer_gpt(), four_layer_llama(), four_layer_qwen(), four_layer_qwen3()})
    for (const double dropout : {0.0, 0.1})
      for (const auto& [granularity, method, layers] :
           {std::tuple{megaplan::RecomputeGranularity::kNone, megaplan::RecomputeMethod::kUniform, int64_t{1}},
            {megaplan::RecomputeGranularity::kSelective, megaplan::RecomputeMethod::kUniform, 1},
            {megaplan::RecomputeGranularity::kFull, megaplan::RecomputeMethod::kUniform, 3},
            {megaplan::RecomputeGranularity::kFull, megaplan::RecomputeMethod::kBlock, 2}}) {
        megaplan::ParallelPlan plan = layout(1, 1, 1, 1, ScheduleKind::kOneFOneB, 2, 2);
        plan.recompute_granularity = granularity;
        plan.recompute_method = method;
        plan.recompute_num_layers = layers;
        plan.options.hidden_dropout = plan.options.attention_dropout = dropout;
        INFO(model.name << ": " << megaplan::to_string(granularity) << " " << megaplan::to_string(method) << " "
                        << layers << ", dropout " << dropout);
        RecordingBackend backend;
        StageChunk gpt(model, plan, 0, backend, {42});
        const MicrobatchTokens data = microbatch(model, 2);
        check_stage(gpt, backend, model, plan, 0, &data, true, true);
      }
}

TEST_CASE("first, middle and last pipeline stages launch their kernel lists, with and without dropout",
          "[model][kernels]") {
  for (const megaplan::ModelSpec& model : {four_layer_gpt(), four_layer_llama()})
    for (const double dropout : {0.0, 0.1}) {
      megaplan::ParallelPlan plan = layout(1, 2, 1, 2, ScheduleKind::kInterleaved, 1, 4);
      plan.recompute_granularity = megaplan::RecomputeGranularity::kSelective;
      plan.options.hidden_dropout = plan.options.attention_dropout = dropout;
      const MicrobatchTokens data = microbatch(model, 1);
      for (int64_t stage = 0; stage < plan.num_virtual_stages(); ++stage) {
        INFO(model.name << ": stage " << stage << ", dropout " << dropout);
        const bool first = stage == 0, last = stage + 1 == plan.num_virtual_stages();
        RecordingBackend backend;
        StageChunk gpt(model, plan, stage, backend, {42});
        check_stage(gpt, backend, model, plan, stage, first || last ? &data : nullptr, first, last);
      }
    }
}

TEST_CASE("each tensor-parallel rank launches its kernel list, with and without sequence parallelism",
          "[model][kernels]") {
  for (const megaplan::ModelSpec& model : {four_layer_gpt(), four_layer_llama(), four_layer_qwen(), four_layer_qwen3()})
    for (const bool sequence_parallel : {false, true}) {
      megaplan::ParallelPlan plan = layout(2, 1, 1, 1, ScheduleKind::kOneFOneB, 2, 2);
      plan.sequence_parallel = sequence_parallel;
      plan.options.hidden_dropout = sequence_parallel ? 0.1 : 0.0;
      INFO(model.name << ": sequence parallel " << sequence_parallel << ", hidden dropout "
                      << plan.options.hidden_dropout);
      megaplan::exec::InProcessWorld world(2, std::chrono::seconds(60));
      std::vector<std::vector<Kernel>> launched(2), listed(2);
      std::vector<std::vector<Allocation>> allocated(2);
      std::size_t parameter_buffer = 0;
      megaplan::exec::run_rank_threads(world, 2, [&](int64_t rank) {
        std::unique_ptr<megaplan::exec::Comm> tp = world.group(rank, {0, 1}, "tp");
        RecordingBackend backend;
        StageChunk gpt(model, plan, 0, backend, {42}, nullptr, tp.get());
        const MicrobatchTokens data = microbatch(model, 2);
        backend.take();
        gpt.forward(0, &data);
        gpt.backward_input(0, nullptr, 1.0f, nullptr, false);
        const PlanKernels list(model, plan, rank);
        const auto index = static_cast<std::size_t>(rank);
        launched[index] = backend.take();
        allocated[index] = backend.take_allocations();
        if (rank == 0) parameter_buffer = gpt.layout().total;
        listed[index] = list.stage_kernels(0, SchedulePart::kForward);
        for (const Kernel& kernel : list.stage_kernels(0, SchedulePart::kBackward)) listed[index].push_back(kernel);
      });
      // Without recomputation one F and B allocate the parameter buffers, the scratch and one
      // microbatch's set of every layer (sequence parallelism's gathered and partial rows included).
      const megaplan::LayerRecipe recipe(model, plan, megaplan::exec::executor_precision(megaplan::exec::CpuBackend()));
      std::vector<Allocation> expected = std::vector{Allocation{false, static_cast<int64_t>(parameter_buffer)},
                                                     Allocation{false, static_cast<int64_t>(parameter_buffer)}} +
                                         recipe_buffers(recipe.scratch(true)) + recipe_buffers(recipe.microbatch(true));
      for (int64_t l = 0; l < model.num_layers; ++l)
        expected = expected + recipe_buffers(recipe.kept(megaplan::LayerKeep::kAll));
      for (std::size_t rank = 0; rank < 2; ++rank) {
        INFO("tensor-parallel rank " << rank);
        check_same(launched[rank], listed[rank]);
        check_allocations(allocated[rank], expected);
      }
      if (model.add_bias_linear) CHECK(listed[0] != listed[1]);  // rank 0 alone adds the row-parallel biases
    }
}

TEST_CASE("each context-parallel rank launches its kernel list, the ring's step by step", "[model][kernels]") {
  // Every rank of the ring runs the same work at each step (core/context_parallel.h), so every
  // rank launches the one list the simulator costs; and allocates the recipe's buffers, the ring's
  // included. F and B on microbatch 0, F, I and W on microbatch 1, as check_stage runs them.
  for (const megaplan::ModelSpec& model : {four_layer_gpt(), four_layer_llama()})
    for (const int64_t cp : {2, 4})
      for (const bool selective : {false, true}) {
        megaplan::ParallelPlan plan = layout(1, 1, 1, 1, ScheduleKind::kOneFOneB, 2, 2);
        plan.context_parallel_size = cp;
        if (selective) plan.recompute_granularity = megaplan::RecomputeGranularity::kSelective;
        plan.options.hidden_dropout = plan.options.attention_dropout = selective ? 0.1 : 0.0;
        INFO(model.name << ": cp " << cp << (selective ? ", selective recomputation, dropout" : ""));
        megaplan::exec::InProcessWorld world(cp, std::chrono::seconds(60));
        std::vector<int64_t> members(static_cast<std::size_t>(cp));
        for (int64_t r = 0; r < cp; ++r) members[static_cast<std::size_t>(r)] = r;
        std::vector<std::vector<Kernel>> launched(static_cast<std::size_t>(cp));
        std::vector<std::vector<Allocation>> allocated(static_cast<std::size_t>(cp));
        std::size_t parameter_buffer = 0;
        megaplan::exec::run_rank_threads(world, cp, [&](int64_t rank) {
          std::unique_ptr<megaplan::exec::Comm> group = world.group(rank, members, "cp");
          RecordingBackend backend;
          StageChunk gpt(model, plan, 0, backend, {42}, nullptr, nullptr, 0, group.get());
          const MicrobatchTokens data = microbatch(model, 2);
          const auto index = static_cast<std::size_t>(rank);
          backend.take();
          gpt.forward(0, &data);
          gpt.backward_input(0, nullptr, 1.0f, nullptr, false);
          gpt.forward(1, &data);
          gpt.backward_input(1, nullptr, 1.0f, nullptr, true);
          gpt.backward_weight(1);
          launched[index] = backend.take();
          allocated[index] = backend.take_allocations();
          if (rank == 0) parameter_buffer = gpt.layout().total;
        });
        const PlanKernels list(model, plan);
        std::vector<Kernel> listed;
        for (const SchedulePart part : {SchedulePart::kForward, SchedulePart::kBackward, SchedulePart::kForward,
                                        SchedulePart::kBackwardInput, SchedulePart::kBackwardWeight}) {
          for (const Kernel& kernel : list.stage_kernels(0, part)) listed.push_back(kernel);
        }
        // The ring's kernels are in the list, step by step as ring() describes them.
        CHECK(list.ring().forward.steps.size() == static_cast<std::size_t>(cp));
        CHECK(std::count(listed.begin(), listed.end(), list.ring().forward.steps.back().kernels.front()) > 0);
        const megaplan::LayerRecipe recipe(model, plan,
                                           megaplan::exec::executor_precision(megaplan::exec::CpuBackend()));
        std::vector<Allocation> expected = std::vector{Allocation{false, static_cast<int64_t>(parameter_buffer)},
                                                       Allocation{false, static_cast<int64_t>(parameter_buffer)}} +
                                           recipe_buffers(recipe.scratch(true)) +
                                           recipe_buffers(recipe.microbatch(true));
        for (int64_t l = 0; l < model.num_layers; ++l) {
          expected = expected +
                     recipe_buffers(
                         recipe.kept(selective ? megaplan::LayerKeep::kAllButAttention : megaplan::LayerKeep::kAll)) +
                     recipe_buffers(recipe.deferred());
        }
        expected.push_back({true, recipe.deferred_embedding_gradient().count});
        for (std::size_t rank = 0; rank < launched.size(); ++rank) {
          INFO("context-parallel rank " << rank);
          check_same(launched[rank], listed);
          check_allocations(allocated[rank], expected, recipe_buffers(recipe.kept(megaplan::LayerKeep::kAll)));
        }
      }
}

TEST_CASE("MoE layers launch their kernel list at the stated load, on every expert- and tensor-parallel rank",
          "[model][kernels][moe]") {
  // A routing of the stated load (each expert's routes as core's moe_stated_load has them before any
  // capacity) drives the executor; the list is core's at that --moe-imbalance. Dense and MoE layers
  // interleave (Mixtral's fixture), a shared expert behind its gate and the sequence aux loss under
  // a padded capacity (Qwen's). Under ep 2 each rank's experts receive rows from both ranks: the
  // regrouping copies and the experts' GEMMs are each rank's own. Under tp 2 (sequence parallel)
  // each rank routes its half of the rows (one sequence of two: its own sequence loss) and computes
  // its shard of every row its tp group's experts take, and of the shared expert over the group's rows.
  // Under cp 2 each rank routes its own tokens of the sequences, and the switch loss's counts and the
  // load's for the log are summed over the cp group (not Qwen's fixture: its sequence loss is refused).
  // Split (I then W, as ZB-H1, ZBV and DualPipeV run them): I keeps each weight GEMM's output
  // gradient, W computes the weight gradients (gathering the shared expert's input again under tp).
  // At etp 1 under tp 2 each rank computes whole experts over its own rows: no rows cross the tp
  // group, and the log's load is summed over it. At etp 2 under tp 4 (a query group a head) the
  // rows cross each etp pair of the tp group, and the log's load is summed over the whole tp group.
  for (const megaplan::ModelSpec& fixture :
       {megaplan::test::four_layer_mixtral(), megaplan::test::four_layer_qwen_moe(),
        megaplan::test::four_layer_shared_expert_moe()})
    for (const int64_t tp : {1, 2, 4})
      for (const int64_t ep : {1, 2})
        for (const int64_t cp : {1, 2})
          for (const double imbalance : {1.0, 1.5})
            for (const megaplan::RecomputeGranularity recompute :
                 {megaplan::RecomputeGranularity::kNone, megaplan::RecomputeGranularity::kSelective,
                  megaplan::RecomputeGranularity::kFull})
              for (const bool split : {false, true})
                for (const int64_t etp : {int64_t{0}, int64_t{1}, int64_t{2}}) {
                  if (etp == 1 && tp == 1) continue;
                  // tp 4 at etp 2 alone, unrecomputed and balanced; not under the sequence loss, whose
                  // sequences tp 4 would cut (a microbatch holds two).
                  if ((tp == 4) != (etp == 2)) continue;
                  if (tp == 4 && (cp > 1 || imbalance > 1 || recompute != megaplan::RecomputeGranularity::kNone ||
                                  fixture.moe.load_balancing == megaplan::LoadBalancing::kSeqAuxLoss))
                    continue;
                  megaplan::ModelSpec model = fixture;
                  if (tp == 4) model.num_query_groups = model.num_attention_heads;
                  // The split backward and whole experts at the balanced load: the stated load's rows
                  // reach them as every other pass (and keeps the suite's time).
                  if ((split || etp == 1) && imbalance > 1) continue;
                  if (cp > 1 && (model.moe.load_balancing == megaplan::LoadBalancing::kSeqAuxLoss || tp * ep > 2))
                    continue;
                  megaplan::ParallelPlan plan = layout(tp, 1, ep, 1, ScheduleKind::kOneFOneB, 2, 4 * ep);
                  plan.sequence_parallel = tp > 1;
                  plan.expert_model_parallel_size = ep;
                  plan.context_parallel_size = cp;
                  plan.moe_imbalance = imbalance;
                  plan.recompute_granularity = recompute;
                  plan.recompute_num_layers = 2;  // full: two groups of two, each MoE layer's forward again
                  plan.expert_tensor_parallel_size = etp;
                  INFO(model.name << ": tp " << tp << ", ep " << ep << ", cp " << cp << ", imbalance " << imbalance
                                  << ", recomputation " << megaplan::to_string(recompute) << ", split " << split
                                  << ", etp " << plan.expert_tensor_parallel());
                  megaplan::MoeDims dropless = *megaplan::LayerRecipe(model, plan).moe;
                  dropless.capacity = 0;
                  dropless.padded = false;
                  const std::vector<int64_t> routes = megaplan::moe_stated_load(dropless, imbalance).dispatched;
                  const int64_t ranks = tp * cp * ep;
                  megaplan::exec::InProcessWorld world(ranks, std::chrono::seconds(60));
                  std::vector<std::vector<Kernel>> launched(static_cast<std::size_t>(ranks));
                  std::vector<std::vector<megaplan::MoeCollective>> expert_calls(static_cast<std::size_t>(ranks)),
                      tensor_calls(static_cast<std::size_t>(ranks)), context_calls(static_cast<std::size_t>(ranks)),
                      expert_tensor_calls(static_cast<std::size_t>(ranks));
                  megaplan::exec::run_rank_threads(world, ranks, [&](int64_t rank) {
                    // tp innermost, then cp: rank = (ep rank x cp + cp rank) x tp + tp rank.
                    const int64_t tp_rank = rank % tp, cp_rank = rank / tp % cp, ep_rank = rank / (tp * cp);
                    std::vector<int64_t> tensor_members, expert_members, context_members, expert_tensor_members;
                    for (int64_t i = 0; i < tp; ++i) tensor_members.push_back((ep_rank * cp + cp_rank) * tp + i);
                    // etp 2: the tp group's pairs.
                    const int64_t pair_first = rank - tp_rank % 2;
                    if (etp == 2) expert_tensor_members = {pair_first, pair_first + 1};
                    for (int64_t i = 0; i < ep; ++i) expert_members.push_back((i * cp + cp_rank) * tp + tp_rank);
                    for (int64_t i = 0; i < cp; ++i) context_members.push_back((ep_rank * cp + i) * tp + tp_rank);
                    std::unique_ptr<megaplan::exec::Comm> tensor =
                        world.group(rank, tensor_members, "tp" + std::to_string(ep_rank * cp + cp_rank));
                    std::unique_ptr<megaplan::exec::Comm> expert =
                        world.group(rank, expert_members, "ep" + std::to_string(cp_rank * tp + tp_rank));
                    std::unique_ptr<megaplan::exec::Comm> context =
                        world.group(rank, context_members, "cp" + std::to_string(ep_rank * tp + tp_rank));
                    megaplan::test::RecordingComm tensor_calls_of(*tensor, megaplan::MoeGroup::kTensor);
                    megaplan::test::RecordingComm expert_calls_of(*expert, megaplan::MoeGroup::kExpert);
                    megaplan::test::RecordingComm context_calls_of(*context, megaplan::MoeGroup::kContext);
                    std::unique_ptr<megaplan::exec::Comm> expert_tensor =
                        etp == 2 ? world.group(rank, expert_tensor_members, "etp" + std::to_string(pair_first))
                                 : nullptr;
                    std::optional<megaplan::test::RecordingComm> expert_tensor_calls_of;
                    if (expert_tensor)
                      expert_tensor_calls_of.emplace(*expert_tensor, megaplan::MoeGroup::kExpertTensor);
                    RecordingBackend backend;
                    backend.route_by_counts(routes);
                    // etp 1: whole experts, no expert tensor-parallel group; etp 2: the pair's.
                    const std::optional<megaplan::exec::Comm*> cut =
                        etp == 1   ? std::optional<megaplan::exec::Comm*>(nullptr)
                        : etp == 2 ? std::optional<megaplan::exec::Comm*>(&*expert_tensor_calls_of)
                                   : std::nullopt;
                    StageChunk chunk(model, plan, 0, backend, {42}, nullptr, tp > 1 ? &tensor_calls_of : nullptr, 0,
                                     cp > 1 ? &context_calls_of : nullptr, ep > 1 ? &expert_calls_of : nullptr, cut);
                    tensor_calls_of.take();
                    expert_calls_of.take();
                    context_calls_of.take();
                    if (expert_tensor_calls_of) expert_tensor_calls_of->take();
                    const MicrobatchTokens data = microbatch(model, 2);
                    backend.take();
                    for (int64_t microbatch_index = 0; microbatch_index < 2; ++microbatch_index) {
                      chunk.forward(microbatch_index, &data);
                      chunk.backward_input(microbatch_index, nullptr, 1.0f, nullptr, split);
                      if (split) chunk.backward_weight(microbatch_index);
                    }
                    launched[static_cast<std::size_t>(rank)] = backend.take();
                    expert_calls[static_cast<std::size_t>(rank)] = expert_calls_of.take();
                    tensor_calls[static_cast<std::size_t>(rank)] = tensor_calls_of.take();
                    context_calls[static_cast<std::size_t>(rank)] = context_calls_of.take();
                    if (expert_tensor_calls_of)
                      expert_tensor_calls[static_cast<std::size_t>(rank)] = expert_tensor_calls_of->take();
                  });
                  const PlanKernels list(model, plan);
                  const std::vector<SchedulePart> parts =
                      split ? std::vector{SchedulePart::kForward, SchedulePart::kBackwardInput,
                                          SchedulePart::kBackwardWeight}
                            : std::vector{SchedulePart::kForward, SchedulePart::kBackward};
                  std::vector<Kernel> listed;
                  for (int i = 0; i < 2; ++i) {
                    for (const SchedulePart part : parts) {
                      for (const Kernel& kernel : list.stage_kernels(0, part)) listed.push_back(kernel);
                    }
                  }
                  // Every rank routes alike; the list is the busiest rank's (rank 0, holding expert 0).
                  INFO("rank 0");
                  check_same(launched[0], listed);
                  // Its collectives are the list's, in order: over the ep group every call the chunk made;
                  // over the tp group the MoE layers' among the attention's and the dense layers'.
                  using megaplan::MoeCollective;
                  const auto of_group = [](const std::vector<MoeCollective>& collectives, megaplan::MoeGroup group) {
                    std::vector<MoeCollective> kept;
                    std::copy_if(collectives.begin(), collectives.end(), std::back_inserter(kept),
                                 [&](const MoeCollective& c) { return c.group == group; });
                    return kept;
                  };
                  const int64_t moe_layers = model.moe.moe_layers(0, model.num_layers);
                  megaplan::ExecutorPrecision fp32_activations;  // the CPU backend's, as its collectives move them
                  fp32_activations.activation_bytes = 4;
                  const megaplan::MoeKernels on_cpu =
                      megaplan::LayerRecipe(model, plan, fp32_activations).moe_mlp_kernels();
                  // An MoE block's collectives: a forward's, full recomputation's forward again, B's (I's) or W's.
                  const auto collectives_of = [&](megaplan::KernelBlock block) -> const std::vector<MoeCollective>* {
                    switch (block) {
                      case megaplan::KernelBlock::kMoeLayerForwardFirst:
                      case megaplan::KernelBlock::kMoeLayerForward: return &on_cpu.forward_collectives;
                      case megaplan::KernelBlock::kMoeLayerRecomputeFirst:
                      case megaplan::KernelBlock::kMoeLayerRecompute: return &on_cpu.forward_again_collectives;
                      case megaplan::KernelBlock::kMoeLayerBackward:
                      case megaplan::KernelBlock::kMoeLayerBackwardInput: return &on_cpu.backward_collectives;
                      case megaplan::KernelBlock::kMoeLayerWeightGradient: return &on_cpu.weight_collectives;
                      default: return nullptr;
                    }
                  };
                  int64_t moe_blocks = 0;
                  for (const megaplan::MoeGroup group :
                       {megaplan::MoeGroup::kExpert, megaplan::MoeGroup::kTensor, megaplan::MoeGroup::kContext,
                        megaplan::MoeGroup::kExpertTensor}) {
                    std::vector<MoeCollective> expected;
                    for (int microbatch_index = 0; microbatch_index < 2; ++microbatch_index) {
                      for (const SchedulePart part : parts) {
                        for (const megaplan::CountedBlock& counted : list.stage_blocks(0, part)) {
                          const std::vector<MoeCollective>* pass = collectives_of(counted.block);
                          for (int64_t i = 0; pass && i < counted.count; ++i) {
                            const std::vector<MoeCollective> collectives = of_group(*pass, group);
                            expected.insert(expected.end(), collectives.begin(), collectives.end());
                            moe_blocks += group == megaplan::MoeGroup::kExpert ? 1 : 0;
                          }
                        }
                      }
                    }
                    if (group == megaplan::MoeGroup::kExpert) {
                      CHECK(expert_calls[0] == expected);
                    } else if (group == megaplan::MoeGroup::kExpertTensor) {
                      CHECK(expert_tensor_calls[0] == expected);
                      CHECK(expected.empty() == (etp != 2));
                    } else if (group == megaplan::MoeGroup::kTensor) {
                      CHECK(listed_in_order_among(tensor_calls[0], expected));
                    } else {
                      // Beside the ring's exchanges (send-receives), the MoE layers' calls alone.
                      std::vector<MoeCollective> moe_calls;
                      std::copy_if(context_calls[0].begin(), context_calls[0].end(), std::back_inserter(moe_calls),
                                   [](const MoeCollective& c) { return c.op != megaplan::CollectiveOp::kSendRecv; });
                      CHECK(moe_calls == expected);
                      CHECK(expected.empty() == (cp == 1));
                    }
                  }
                  // Each microbatch: every MoE layer's forward and B (or I and W), and under full
                  // recomputation its forward again.
                  const bool full = recompute == megaplan::RecomputeGranularity::kFull;
                  CHECK(moe_blocks == 2 * moe_layers * ((full ? 3 : 2) + (split ? 1 : 0)));
                  if (imbalance > 1 || model.moe.expert_capacity_factor) continue;
                  // At the balanced load every rank is the stated one, and a rank sends and receives its
                  // dispatch's rows; its tp group gathers every member's.
                  for (std::size_t rank = 1; rank < launched.size(); ++rank) check_same(launched[rank], listed);
                  const int64_t rows = megaplan::LayerRecipe(model, plan).moe->most_rows;
                  CHECK(rows == 2 * model.seq_length / cp / tp * 2);
                  for (std::size_t rank = 1; rank < launched.size(); ++rank) {
                    CHECK(expert_calls[rank] == expert_calls[0]);
                    CHECK(tensor_calls[rank] == tensor_calls[0]);
                    CHECK(context_calls[rank] == context_calls[0]);
                    CHECK(expert_tensor_calls[rank] == expert_tensor_calls[0]);
                  }
                  // Balanced, each exchange carries the rank's dispatch's rows.
                  std::vector<MoeCollective> exchanges;
                  std::copy_if(list.moe().backward_collectives.begin(), list.moe().backward_collectives.end(),
                               std::back_inserter(exchanges),
                               [](const MoeCollective& c) { return c.op == megaplan::CollectiveOp::kAllToAll; });
                  CHECK(exchanges.size() == (ep > 1 ? 2u : 0u));
                  for (const MoeCollective& exchange : exchanges) CHECK(exchange.bytes == rows * model.hidden_size * 2);
                }
}

TEST_CASE("the optimizer step launches the optimizer's kernel list", "[model][kernels]") {
  const megaplan::ModelSpec model = four_layer_gpt();
  const megaplan::ParallelPlan plan = layout(1, 1, 1, 1, ScheduleKind::kOneFOneB, 2, 2);
  RecordingBackend backend;
  StageChunk gpt(model, plan, 0, backend, {42});
  megaplan::exec::Optimizer optimizer({&gpt}, {}, false, {}, backend);
  const MicrobatchTokens data = microbatch(model, 2);
  gpt.forward(0, &data);
  gpt.backward_input(0, nullptr, 1.0f, nullptr, false);
  backend.take();
  optimizer.step(1, 1e-3, optimizer.gradient_norm());
  // Core's parameter count is what the norm reads and AdamW steps; the fill zeroes the whole buffer.
  const int64_t parameters = megaplan::stage_parameters(model, plan, 0).parameters_per_gpu;
  check_same(backend.take(),
             megaplan::optimizer_kernels(parameters, parameters, 0, {static_cast<int64_t>(gpt.layout().total)}));
}

TEST_CASE("OPTIM's expert-bias update launches its kernel list and moves each bias by the rate",
          "[model][kernels][moe]") {
  // The chunk's four MoE layers (the stage is the whole model): one update each, over the experts.
  const megaplan::ModelSpec model = megaplan::test::four_layer_balanced_moe();
  const megaplan::ParallelPlan plan = layout(1, 1, 1, 1, ScheduleKind::kOneFOneB, 2, 2);
  RecordingBackend backend;
  StageChunk chunk(model, plan, 0, backend, {42});
  megaplan::exec::OptimizerSettings settings;
  settings.expert_bias_update_rate = model.moe.router_bias_update_rate;
  megaplan::exec::Optimizer optimizer({&chunk}, {}, false, settings, backend);
  const MicrobatchTokens data = microbatch(model, 2);
  chunk.forward(0, &data);
  chunk.backward_input(0, nullptr, 1.0f, nullptr, false);
  // The forward counted each token's two routes.
  const StageChunk::ExpertBiases& biases = chunk.expert_biases();
  REQUIRE(biases.layers == std::vector<int64_t>{0, 1, 2, 3});
  for (std::size_t layer = 0; layer < 4; ++layer) {
    int64_t routes = 0;
    for (std::size_t e = 0; e < 4; ++e) routes += biases.routed[layer * 4 + e];
    CHECK(routes == 2 * 2 * model.seq_length);
  }
  backend.take();
  optimizer.update_expert_biases();
  check_same(backend.take(), megaplan::expert_bias_kernels(model, 4));
  CHECK(std::all_of(biases.routed.begin(), biases.routed.end(), [](int64_t n) { return n == 0; }));
  // Every bias moved by the rate, up or down (an expert at exactly the mean stays).
  std::vector<float> moved(16);
  backend.download(moved.data(), biases.biases, moved.size());
  for (const float bias : moved) CHECK((bias == 0.0f || std::abs(bias) == Approx(1e-2)));
  CHECK(std::any_of(moved.begin(), moved.end(), [](float bias) { return bias != 0.0f; }));
}

TEST_CASE("the profiler's launch of a listed kernel is that kernel", "[kernels]") {
  // Every kind in every layout, epilogue and fused variant the lists use: what `megaplan profile`
  // times is what the simulator looks up.
  using megaplan::GemmEpilogue;
  using megaplan::GemmLayout;
  using megaplan::KernelKind;
  std::vector<Kernel> kernels;
  for (const GemmLayout layout : megaplan::kGemmLayouts) {
    const std::vector<GemmEpilogue> epilogues =
        layout == GemmLayout::kForward ? std::vector{GemmEpilogue::kNone, GemmEpilogue::kBias, GemmEpilogue::kBiasGelu}
        : layout == GemmLayout::kInputGradient ? std::vector{GemmEpilogue::kNone, GemmEpilogue::kGeluGradient}
                                               : std::vector{GemmEpilogue::kNone, GemmEpilogue::kBiasGradient};
    for (const GemmEpilogue epilogue : epilogues) kernels.push_back(megaplan::gemm_kernel(layout, epilogue, 6, 10, 4));
  }
  for (const KernelKind kind : {KernelKind::kAttentionForward, KernelKind::kAttentionBackward}) {
    kernels.push_back(megaplan::attention_kernel(kind, 2, 8, 3, 4));
    kernels.push_back(megaplan::attention_kernel(kind, 2, 8, 4, 4, 2));  // 4 heads in 2 query groups
  }
  for (const bool fused : {false, true}) {
    for (const KernelKind kind : {KernelKind::kNormForward, KernelKind::kNormBackward, KernelKind::kRmsNormForward,
                                  KernelKind::kRmsNormBackward}) {
      kernels.push_back(megaplan::row_kernel(kind, 6, 8, fused));
    }
  }
  for (const KernelKind kind : {KernelKind::kSwigluForward, KernelKind::kSwigluBackward}) {
    kernels.push_back(megaplan::row_kernel(kind, 6, 8));
  }
  for (const KernelKind kind : {KernelKind::kAttentionBlockForward, KernelKind::kAttentionBlockBackward}) {
    for (const bool diagonal : {false, true}) {
      kernels.push_back(megaplan::attention_block_kernel(kind, 2, 4, 3, 4, 3, false, diagonal));
      kernels.push_back(megaplan::attention_block_kernel(kind, 1, 4, 4, 4, 2, true, diagonal));  // GQA, dropout
    }
  }
  for (const int64_t packed : {512, 256, 8}) {  // heads of 128, of 64, of 2
    for (const KernelKind kind : {KernelKind::kPackKeyValues, KernelKind::kUnpackKeyValueGradients}) {
      kernels.push_back(megaplan::row_kernel(kind, 5, packed));
    }
  }
  for (const int64_t rotated : {256, 192, 6}) {  // heads of 128, of 64, of 2
    kernels.push_back(megaplan::row_kernel(KernelKind::kRotary, 5, rotated));
  }
  for (const KernelKind kind : {KernelKind::kEmbeddingForward, KernelKind::kEmbeddingBackward,
                                KernelKind::kCrossEntropyForward, KernelKind::kCrossEntropyBackward}) {
    kernels.push_back(megaplan::row_kernel(kind, 6, 16));
  }
  for (const KernelKind kind :
       {KernelKind::kAdd, KernelKind::kCopy, KernelKind::kFill, KernelKind::kZero, KernelKind::kConvert,
        KernelKind::kGradientNorm, KernelKind::kAdamw, KernelKind::kRefreshCompute}) {
    kernels.push_back(megaplan::flat_kernel(kind, 100));
  }
  // Mixture of experts: 12 tokens over 8 experts, top 2 (and a z loss, which has no top k).
  using megaplan::moe_kernel;
  for (const KernelKind kind :
       {KernelKind::kMoeTopK, KernelKind::kMoeTopKBackward, KernelKind::kMoeDispatch, KernelKind::kMoeAuxCounts,
        KernelKind::kMoeSwitchLoss, KernelKind::kMoeSwitchLossGradient}) {
    kernels.push_back(moe_kernel(kind, 12, 8, 2));
  }
  for (const KernelKind kind : {KernelKind::kMoeSequenceAuxLoss, KernelKind::kMoeSequenceAuxLossGradient}) {
    kernels.push_back(moe_kernel(kind, 12, 8, 2, 3));  // three sequences of four tokens
  }
  for (const KernelKind kind : {KernelKind::kMoeZLoss, KernelKind::kMoeZLossGradient}) {
    kernels.push_back(moe_kernel(kind, 12, 8, 0));
  }
  kernels.push_back(megaplan::row_kernel(KernelKind::kMoePermute, 24, 16));
  kernels.push_back(moe_kernel(KernelKind::kMoePermuteBackward, 12, 16, 2));
  kernels.push_back(moe_kernel(KernelKind::kMoeCombine, 12, 16, 2));
  kernels.push_back(moe_kernel(KernelKind::kMoeCombineBackward, 12, 16, 2, 24));
  kernels.push_back(moe_kernel(KernelKind::kMoeCombineBackward, 12, 16, 2, 32));  // padded to capacity
  for (const KernelKind kind : {KernelKind::kSigmoidGatedAdd, KernelKind::kSigmoidGatedAddBackward}) {
    kernels.push_back(megaplan::row_kernel(kind, 12, 16));
  }
  RecordingBackend backend;
  for (const Kernel& kernel : kernels) {
    INFO(megaplan::describe(kernel));
    megaplan::exec::KernelLaunch launch(backend, kernel, {16, 8});
    backend.take();
    launch();
    check_same(backend.take(), {kernel});
  }
  CHECK_THROWS_AS(megaplan::exec::KernelLaunch(backend, megaplan::row_kernel(KernelKind::kElementwise, 4, 6)),
                  std::invalid_argument);
}

TEST_CASE("under --fp16 the executor's GEMMs are listed with fp16 operands and nothing else changes", "[kernels]") {
  const megaplan::ModelSpec model = four_layer_gpt();
  megaplan::ParallelPlan plan = layout(2, 2, 1, 1, ScheduleKind::kOneFOneB);
  const PlanKernels bf16(model, plan);
  plan.options.precision = DType::kFloat16;
  const PlanKernels fp16(model, plan);
  int64_t gemms = 0;
  for (std::size_t b = 0; b < megaplan::kNumKernelBlocks; ++b) {
    const auto block = static_cast<megaplan::KernelBlock>(b);
    REQUIRE(fp16.block(block).size() == bf16.block(block).size());
    for (std::size_t i = 0; i < bf16.block(block).size(); ++i) {
      Kernel expected = bf16.block(block)[i];
      CHECK(expected.precision == DType::kBFloat16);
      if (expected.kind == megaplan::KernelKind::kGemm) {
        expected.precision = DType::kFloat16;
        ++gemms;
      }
      CHECK(fp16.block(block)[i] == expected);
    }
  }
  CHECK(gemms > 0);
}
