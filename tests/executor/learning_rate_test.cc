// The learning-rate schedule against Megatron-LM's OptimizerParamScheduler, values worked by hand.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "executor/train/learning_rate.h"

using megaplan::exec::DecayStyle;
using megaplan::exec::LearningRateSchedule;

TEST_CASE("warm-up, then linear or cosine decay to min-lr, as Megatron", "[train]") {
  LearningRateSchedule schedule;
  schedule.max_lr = 6e-4;
  schedule.min_lr = 6e-5;
  schedule.warmup_iterations = 10;
  schedule.decay_iterations = 110;
  schedule.style = DecayStyle::kCosine;
  schedule.validate();
  CHECK(schedule.at(1) == Approx(6e-5));    // 6e-4 * 1 / 10
  CHECK(schedule.at(10) == Approx(6e-4));   // end of warm-up
  CHECK(schedule.at(60) == Approx(3.3e-4)); // halfway: min + (max - min) / 2
  CHECK(schedule.at(110) == Approx(6e-5));
  CHECK(schedule.at(500) == Approx(6e-5));
  schedule.style = DecayStyle::kLinear;
  CHECK(schedule.at(35) == Approx(6e-5 + 0.75 * 5.4e-4));
  schedule.style = DecayStyle::kConstant;
  CHECK(schedule.at(5) == Approx(3e-4));
  CHECK(schedule.at(1000) == Approx(6e-4));
}

TEST_CASE("bad schedules name the flag", "[train]") {
  LearningRateSchedule schedule;
  schedule.max_lr = 1e-4;
  schedule.min_lr = 1e-3;
  CHECK_THROWS_WITH(schedule.validate(), Catch::Matchers::Contains("--min-lr"));
  schedule.min_lr = 0;
  schedule.warmup_iterations = 100;
  schedule.decay_iterations = 50;
  CHECK_THROWS_WITH(schedule.validate(), Catch::Matchers::Contains("--lr-decay-iters: 50 is shorter"));
  CHECK_THROWS_WITH(megaplan::exec::parse_decay_style("step"), Catch::Matchers::Contains("--lr-decay-style"));
}
