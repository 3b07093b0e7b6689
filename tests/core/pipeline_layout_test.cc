// Virtual stage placement: Megatron's loop (stage % pp) and the V of ZBV/DualPipeV.
#include <catch2/catch.hpp>

#include "core/pipeline_layout.h"

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
  CHECK(megaplan::layers_per_virtual_stage(model, plan) == 2);
  // Megatron's get_transformer_layer_offset: virtual rank 1 of pipeline rank 2 starts at layer
  // 1 * (24 / 3) + 2 * (24 / 4 / 3) = 12, which is stage 6's first layer.
  CHECK(megaplan::first_layer_of_stage(6, model, plan) == 12);
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
