// Virtual stage placement: Megatron's loop (stage % pp) and the V of ZBV/DualPipeV.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "core/pipeline_layout.h"

using Catch::Matchers::Contains;

using megaplan::StagePlacement;

TEST_CASE("loop placement puts stage s on rank s % pp", "[pipeline_layout]") {
  megaplan::ParallelPlan plan;
  plan.pipeline_parallel_size = 4;
  plan.virtual_pipeline_parallel_size = 3;
  plan.schedule = megaplan::ScheduleKind::kInterleaved;
  CHECK(megaplan::stages_of_pipeline_rank(0, plan) == std::vector<int64_t>{0, 4, 8});
  CHECK(megaplan::stages_of_pipeline_rank(3, plan) == std::vector<int64_t>{3, 7, 11});
  megaplan::ModelSpec model;
  model.num_layers = 24;
  CHECK(megaplan::stage_layers(6, model, plan).num_layers == 2);
  // Megatron's get_transformer_layer_offset: virtual rank 1 of pipeline rank 2 starts at layer
  // 1 * (24 / 3) + 2 * (24 / 4 / 3) = 12, which is stage 6's first layer.
  CHECK(megaplan::stage_layers(6, model, plan).first_layer == 12);
}

TEST_CASE("V placement zig-zags two stages per rank", "[pipeline_layout]") {
  CHECK(megaplan::pipeline_rank_of_stage(0, 4, StagePlacement::kV) == 0);
  CHECK(megaplan::pipeline_rank_of_stage(3, 4, StagePlacement::kV) == 3);
  CHECK(megaplan::pipeline_rank_of_stage(4, 4, StagePlacement::kV) == 3);
  CHECK(megaplan::pipeline_rank_of_stage(7, 4, StagePlacement::kV) == 0);
  megaplan::ParallelPlan plan;
  plan.pipeline_parallel_size = 4;
  plan.virtual_pipeline_parallel_size = 2;
  plan.schedule = megaplan::ScheduleKind::kZeroBubbleV;
  CHECK(megaplan::stages_of_pipeline_rank(1, plan) == std::vector<int64_t>{1, 6});
}

TEST_CASE("uneven stages follow Megatron's first/last and account-for rules", "[pipeline_layout]") {
  megaplan::ModelSpec model;
  model.num_layers = 126;  // Llama 3.1 405B
  megaplan::ParallelPlan plan;
  plan.pipeline_parallel_size = 16;
  plan.pipeline_split.account_for_embedding = true;
  plan.pipeline_split.account_for_loss = true;
  // 126 + 2 = 128 units over 16 stages: 8 each, the embedding's and the loss's stage one layer fewer.
  std::vector<int64_t> expected(16, 8);
  expected.front() = expected.back() = 7;
  CHECK(megaplan::stage_layer_counts(model, plan) == expected);
  CHECK(megaplan::stage_layers(1, model, plan).first_layer == 7);
  CHECK(megaplan::stage_layers(15, model, plan).first_layer == 119);

  // --decoder-first/last-pipeline-num-layers 6 with 30 layers on pp 4, vpp 3: ranks hold 6, 9, 9, 6,
  // each chunk a third. Megatron's offset for virtual rank 1 of pipeline rank 0: 1 * 30 / 3 = 10.
  model.num_layers = 30;
  plan = megaplan::ParallelPlan{};
  plan.pipeline_parallel_size = 4;
  plan.virtual_pipeline_parallel_size = 3;
  plan.schedule = megaplan::ScheduleKind::kInterleaved;
  plan.pipeline_split.first_stage_layers = 6;
  plan.pipeline_split.last_stage_layers = 6;
  CHECK(megaplan::stage_layer_counts(model, plan) == std::vector<int64_t>{2, 3, 3, 2, 2, 3, 3, 2, 2, 3, 3, 2});
  CHECK(megaplan::stage_layers(4, model, plan).first_layer == 10);
  CHECK(megaplan::stage_layers(11, model, plan).first_layer == 28);
  // Only the first given: the other three ranks share 24.
  plan.pipeline_split.last_stage_layers = 0;
  plan.virtual_pipeline_parallel_size = 1;
  plan.schedule = megaplan::ScheduleKind::kOneFOneB;
  CHECK(megaplan::stage_layer_counts(model, plan) == std::vector<int64_t>{6, 8, 8, 8});
}

TEST_CASE("impossible uneven splits are refused naming the flag", "[pipeline_layout]") {
  megaplan::ModelSpec model;
  model.num_layers = 30;
  megaplan::ParallelPlan plan;
  plan.pipeline_parallel_size = 4;
  CHECK_THROWS_WITH(megaplan::stage_layer_counts(model, plan),
                    Contains("--num-layers: 30 must be divisible by pp*vpp = 4*1 = 4; uneven stages"));
  plan.pipeline_split.first_stage_layers = 5;
  CHECK_THROWS_WITH(megaplan::stage_layer_counts(model, plan),
                    Contains("--decoder-first-pipeline-num-layers: leaves 25 of the 30 layers to the other 3"));
  plan.pipeline_split.account_for_loss = true;
  CHECK_THROWS_WITH(megaplan::stage_layer_counts(model, plan), Contains("cannot be combined with --account-for"));
  plan.pipeline_split = megaplan::PipelineSplit{.first_stage_layers = 6, .last_stage_layers = 6};
  plan.virtual_pipeline_parallel_size = 2;
  plan.schedule = megaplan::ScheduleKind::kInterleaved;
  CHECK_THROWS_WITH(megaplan::stage_layer_counts(model, plan),
                    Contains("--virtual-pipeline-model-parallel-size: must divide the 9 layers of pipeline rank 1"));
  // One unit per stage leaves the embedding's stage without a layer.
  model.num_layers = 3;
  plan = megaplan::ParallelPlan{};
  plan.pipeline_parallel_size = 4;
  plan.pipeline_split.account_for_embedding = true;
  CHECK_THROWS_WITH(megaplan::stage_layer_counts(model, plan),
                    Contains("leaves virtual stage 0 without a transformer layer"));
}
