// core/executor_memory.h predicts what the executor allocates: every rank of every layout trains
// on the CPU backend (ranks as threads), and the most bytes its backend held at once must be the
// prediction for its pipeline rank, to the byte. (The staging of logged host values, which the
// prediction leaves out, comes and goes below the peak.)
#include <catch2/catch.hpp>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/executor_memory.h"
#include "core/parallel_plan.h"
#include "core/schedule/lowering.h"
#include "core/schedule/schedule.h"
#include "executor/runtime/cpu_backend.h"
#include "executor/train/trainer.h"
#include "tests/executor/runtime/forwarding_backend.h"
#include "tests/executor/train/training_fixtures.h"
#include "tests/executor/train/training_run.h"

namespace {

using megaplan::ParallelPlan;
using megaplan::RecomputeGranularity;
using megaplan::RecomputeMethod;
using megaplan::ScheduleKind;
namespace exec = megaplan::exec;

// A CPU backend that reports its peak to `peaks[rank]` when the run ends.
class PeakReportingBackend : public megaplan::test::ForwardingBackend {
 public:
  PeakReportingBackend(std::vector<int64_t>& peaks, std::mutex& mutex, int64_t rank)
      : ForwardingBackend(std::make_unique<exec::CpuBackend>()), peaks_(peaks), mutex_(mutex), rank_(rank) {}
  ~PeakReportingBackend() override {
    const std::lock_guard<std::mutex> lock(mutex_);
    peaks_[static_cast<std::size_t>(rank_)] = peak_bytes();
  }

 private:
  std::vector<int64_t>& peaks_;
  std::mutex& mutex_;
  int64_t rank_;
};

ParallelPlan with(ParallelPlan plan, RecomputeGranularity granularity,
                  RecomputeMethod method = RecomputeMethod::kUniform, int64_t layers = 1) {
  plan.recompute_granularity = granularity;
  plan.recompute_method = method;
  plan.recompute_num_layers = layers;
  return plan;
}

}  // namespace

TEST_CASE("the executor allocates what core's memory prediction says, rank by rank", "[memory]") {
  using megaplan::test::layout;
  const megaplan::test::ScratchDirectory scratch;
  const std::string corpus = megaplan::test::sentence_corpus(scratch);
  ParallelPlan sequence_parallel = layout(2, 1, 1, 1, ScheduleKind::kOneFOneB);
  sequence_parallel.sequence_parallel = true;
  const auto uneven = [](ParallelPlan plan) {  // --decoder-first-pipeline-num-layers 1
    plan.pipeline_split.first_stage_layers = 1;
    return plan;
  };
  ParallelPlan distributed = layout(1, 2, 2, 1, ScheduleKind::kOneFOneB);
  distributed.use_distributed_optimizer = true;
  // Expert parallelism with a padded capacity: every rank's experts compute exactly the rows their
  // capacity pads to, so what arrives is known before the dispatch (dropless, it is the load's).
  ParallelPlan expert_parallel = distributed;
  expert_parallel.expert_model_parallel_size = 2;
  ParallelPlan context_parallel = layout(1, 1, 1, 1, ScheduleKind::kOneFOneB);
  context_parallel.context_parallel_size = 2;
  ParallelPlan context_everything = layout(2, 2, 1, 1, ScheduleKind::kOneFOneB);
  context_everything.context_parallel_size = 2;
  context_everything.sequence_parallel = true;
  // --expert-tensor-parallel-size 1: whole experts on each tp rank (the shared expert's still cut).
  ParallelPlan whole_experts = sequence_parallel;
  whole_experts.expert_tensor_parallel_size = 1;
  ParallelPlan whole_expert_parallel = layout(2, 1, 2, 1, ScheduleKind::kOneFOneB);
  whole_expert_parallel.sequence_parallel = true;
  whole_expert_parallel.expert_model_parallel_size = 4;
  whole_expert_parallel.expert_tensor_parallel_size = 1;
  ParallelPlan split_sequence_parallel = layout(2, 2, 1, 2, ScheduleKind::kZeroBubbleV);
  split_sequence_parallel.sequence_parallel = true;
  ParallelPlan split_expert_parallel = layout(1, 2, 2, 2, ScheduleKind::kDualPipeV, 2, 16);
  split_expert_parallel.use_distributed_optimizer = true;
  split_expert_parallel.expert_model_parallel_size = 2;
  // --expert-tensor-parallel-size 2 under tp 4 (each expert's half on each of an etp pair) and 4
  // under tp 2 (the etp group across two replicas' tp pairs), on models with four query groups.
  ParallelPlan half_experts = layout(4, 1, 1, 1, ScheduleKind::kOneFOneB);
  half_experts.sequence_parallel = true;
  half_experts.expert_tensor_parallel_size = 2;
  ParallelPlan half_expert_parallel = layout(4, 1, 1, 1, ScheduleKind::kOneFOneB, 4, 8);  // a sequence a tp rank
  half_expert_parallel.sequence_parallel = true;
  half_expert_parallel.expert_tensor_parallel_size = 2;
  half_expert_parallel.expert_model_parallel_size = 2;
  ParallelPlan wide_experts = layout(2, 1, 2, 1, ScheduleKind::kOneFOneB);
  wide_experts.sequence_parallel = true;
  wide_experts.expert_tensor_parallel_size = 4;
  const std::vector<std::pair<std::string, ParallelPlan>> layouts = {
      {"one rank", layout(1, 1, 1, 1, ScheduleKind::kOneFOneB)},
      {"selective", with(layout(1, 1, 1, 1, ScheduleKind::kOneFOneB), RecomputeGranularity::kSelective)},
      {"full uniform 3",
       with(layout(1, 1, 1, 1, ScheduleKind::kOneFOneB), RecomputeGranularity::kFull, RecomputeMethod::kUniform, 3)},
      {"full block 2",
       with(layout(1, 1, 1, 1, ScheduleKind::kOneFOneB), RecomputeGranularity::kFull, RecomputeMethod::kBlock, 2)},
      {"pp2 gpipe", layout(1, 2, 1, 1, ScheduleKind::kGPipe)},
      {"pp2 1f1b", layout(1, 2, 1, 1, ScheduleKind::kOneFOneB)},
      {"pp2 interleaved", layout(1, 2, 1, 2, ScheduleKind::kInterleaved)},
      {"pp2 zb-h1", layout(1, 2, 1, 1, ScheduleKind::kZeroBubbleH1)},
      {"pp2 zbv, selective", with(layout(1, 2, 1, 2, ScheduleKind::kZeroBubbleV), RecomputeGranularity::kSelective)},
      {"pp2 zbv, full uniform 1", with(layout(1, 2, 1, 2, ScheduleKind::kZeroBubbleV), RecomputeGranularity::kFull)},
      {"pp2 dualpipev", layout(1, 2, 1, 2, ScheduleKind::kDualPipeV)},
      {"pp2 dualpipev, 8 microbatches", layout(1, 2, 1, 2, ScheduleKind::kDualPipeV, 2, 16)},
      {"pp2 1f1b, 8 microbatches", layout(1, 2, 1, 1, ScheduleKind::kOneFOneB, 2, 16)},
      {"pp2 1f1b, uneven stages 1 + 3", uneven(layout(1, 2, 1, 1, ScheduleKind::kOneFOneB))},
      {"pp2 zb-h1, uneven stages 1 + 3, full uniform 2",
       with(uneven(layout(1, 2, 1, 1, ScheduleKind::kZeroBubbleH1)), RecomputeGranularity::kFull,
            RecomputeMethod::kUniform, 2)},
      {"tp2 sequence parallel", sequence_parallel},
      {"pp2 dp2 distributed optimizer", distributed},
      {"cp2 (the ring's buffers)", context_parallel},
      {"tp2 x cp2 x pp2, sequence parallel", context_everything},
      {"llama: cp2", context_parallel},
      {"llama: one rank", layout(1, 1, 1, 1, ScheduleKind::kOneFOneB)},
      {"llama: selective", with(layout(1, 1, 1, 1, ScheduleKind::kOneFOneB), RecomputeGranularity::kSelective)},
      {"llama: pp2 interleaved", layout(1, 2, 1, 2, ScheduleKind::kInterleaved)},
      {"llama: tp2 sequence parallel", sequence_parallel},
      {"qwen: one rank", layout(1, 1, 1, 1, ScheduleKind::kOneFOneB)},
      {"qwen: tp2 sequence parallel", sequence_parallel},
      {"qwen3: selective (the query and key norms' input and statistics)",
       with(layout(1, 1, 1, 1, ScheduleKind::kOneFOneB), RecomputeGranularity::kSelective)},
      {"qwen3: tp2 sequence parallel", sequence_parallel},
      {"qwen3-moe: pp2 dp2 distributed optimizer", distributed},
      {"mixtral: one rank", layout(1, 1, 1, 1, ScheduleKind::kOneFOneB)},
      {"mixtral: selective", with(layout(1, 1, 1, 1, ScheduleKind::kOneFOneB), RecomputeGranularity::kSelective)},
      {"mixtral: pp2 interleaved", layout(1, 2, 1, 2, ScheduleKind::kInterleaved)},
      {"mixtral: tp2 sequence parallel (the experts' rows gathered)", sequence_parallel},
      // Full recomputation: an MoE layer's MLP runs its forward and its forward again on a lent
      // set, which then holds an MoE MLP's buffers too (a dense layer's sets as well).
      {"mixtral: full uniform 2",
       with(layout(1, 1, 1, 1, ScheduleKind::kOneFOneB), RecomputeGranularity::kFull, RecomputeMethod::kUniform, 2)},
      {"mixtral: pp2 1f1b, full block 1 (the MoE layers after it keep their buffers)",
       with(layout(1, 2, 1, 1, ScheduleKind::kOneFOneB), RecomputeGranularity::kFull, RecomputeMethod::kBlock, 1)},
      {"shared-expert: tp2 sequence parallel, full uniform 1", with(sequence_parallel, RecomputeGranularity::kFull)},
      {"mixtral: cp2 (each rank's tokens routed)", context_parallel},
      {"shared-expert: tp2 x cp2 x pp2, sequence parallel", context_everything},
      {"qwen-moe: pp2 dp2 ep2 distributed optimizer, full uniform 2",
       with(expert_parallel, RecomputeGranularity::kFull, RecomputeMethod::kUniform, 2)},
      {"shared-expert: tp2 sequence parallel", sequence_parallel},
      {"qwen-moe: pp2 1f1b, 8 microbatches", layout(1, 2, 1, 1, ScheduleKind::kOneFOneB, 2, 16)},
      {"qwen-moe: pp2 dp2 distributed optimizer", distributed},
      {"qwen-moe: pp2 dp2 ep2 distributed optimizer", expert_parallel},
      // A split backward: I keeps each MoE MLP's weight GEMMs' output gradients (the experts' by
      // the rows they compute) with the forward's buffers until W.
      {"mixtral: pp2 zb-h1", layout(1, 2, 1, 1, ScheduleKind::kZeroBubbleH1)},
      {"mixtral: pp2 zbv, full uniform 1",
       with(layout(1, 2, 1, 2, ScheduleKind::kZeroBubbleV), RecomputeGranularity::kFull)},
      {"shared-expert: tp2 x pp2 zbv, sequence parallel", split_sequence_parallel},
      {"qwen-moe: pp2 dp2 ep2 dualpipev, distributed optimizer", split_expert_parallel},
      {"shared-expert: tp2 sequence parallel, etp 1", whole_experts},
      {"qwen-moe: tp2 x dp2 x ep4 sequence parallel, etp 1 (the ep group across tp ranks)", whole_expert_parallel},
      {"mha-mixtral: tp4 sequence parallel, etp 2", half_experts},
      {"mha-qwen-moe: tp4 x ep2 sequence parallel, etp 2", half_expert_parallel},
      {"mha-shared-expert: tp2 x dp2 sequence parallel, etp 4", wide_experts},
      {"balanced-moe: pp2 interleaved (the expert biases and their counts)",
       layout(1, 2, 1, 2, ScheduleKind::kInterleaved)},
  };
  for (const auto& [name, plan] : layouts) {
    INFO(name);
    exec::TrainOptions options;
    options.train_iters = 2;
    options.log_interval = 1;
    options.eval_interval = 2;
    options.eval_iters = 1;
    options.split = "9,1,0";
    options.data_path = corpus;
    options.distributed_timeout_minutes = 2;
    const int64_t world = plan.world_size();
    std::vector<int64_t> peaks(static_cast<std::size_t>(world), 0);
    std::mutex mutex;
    // "mha-": the fixture with a query group a head.
    const bool mha = name.starts_with("mha-");
    const std::string fixture = mha ? name.substr(4) : name;
    megaplan::ModelSpec model = fixture.starts_with("llama")           ? megaplan::test::four_layer_llama()
                                : fixture.starts_with("qwen-moe")      ? megaplan::test::four_layer_qwen_moe()
                                : fixture.starts_with("qwen3-moe")     ? megaplan::test::four_layer_qwen3_moe()
                                : fixture.starts_with("qwen3")         ? megaplan::test::four_layer_qwen3()
                                : fixture.starts_with("qwen")          ? megaplan::test::four_layer_qwen()
                                : fixture.starts_with("mixtral")       ? megaplan::test::four_layer_mixtral()
                                : fixture.starts_with("balanced-moe")  ? megaplan::test::four_layer_balanced_moe()
                                : fixture.starts_with("shared-expert") ? megaplan::test::four_layer_shared_expert_moe()
                                                                       : megaplan::test::four_layer_gpt();
    if (mha) model.num_query_groups = model.num_attention_heads;
    megaplan::test::train_logged(model, plan, options, scratch, "run",
                                 [&](int64_t rank) -> std::unique_ptr<exec::Backend> {
                                   return std::make_unique<PeakReportingBackend>(peaks, mutex, rank);
                                 });
    megaplan::ExecutorPrecision cpu;
    cpu.activation_bytes = 4;
    cpu.attention_keeps_probabilities = true;
    const auto predicted = megaplan::executor_memory_per_pipeline_rank(
        model, plan, megaplan::lower_schedule(megaplan::generate_plan_schedule(plan)), cpu, 0, true);
    for (int64_t rank = 0; rank < world; ++rank) {
      // Megatron's rank order (tp fastest, then cp, dp, and pp last).
      const int64_t pipeline_rank = rank / (world / plan.pipeline_parallel_size);
      const int64_t expected = predicted[static_cast<std::size_t>(pipeline_rank)].total_bytes;
      INFO("rank " << rank << ": allocated " << peaks[static_cast<std::size_t>(rank)] << ", predicted " << expected);
      CHECK(peaks[static_cast<std::size_t>(rank)] == expected);
    }
  }
}
