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
  CHECK(schedule.at(1, 1) == Approx(6e-5));     // 6e-4 * 1 / 10
  CHECK(schedule.at(10, 1) == Approx(6e-4));    // end of warm-up
  CHECK(schedule.at(60, 1) == Approx(3.3e-4));  // halfway: min + (max - min) / 2
  CHECK(schedule.at(110, 1) == Approx(6e-5));
  CHECK(schedule.at(500, 1) == Approx(6e-5));
  schedule.style = DecayStyle::kLinear;
  CHECK(schedule.at(35, 1) == Approx(6e-5 + 0.75 * 5.4e-4));
  schedule.style = DecayStyle::kConstant;
  CHECK(schedule.at(5, 1) == Approx(3e-4));
  CHECK(schedule.at(1000, 1) == Approx(6e-4));
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

TEST_CASE("sample-based lengths and the warm-up fraction count samples, as Megatron's scheduler", "[train]") {
  // GPT-3's script: --lr-warmup-fraction .001 of --lr-decay-iters 430000 at a global batch of 1536:
  // the warm-up ends after 430 iterations, 660480 samples.
  LearningRateSchedule gpt3;
  gpt3.max_lr = 6e-5;
  gpt3.min_lr = 6e-6;
  gpt3.decay_iterations = 430000;
  gpt3.warmup_fraction = 0.001;
  gpt3.style = DecayStyle::kCosine;
  gpt3.validate();
  CHECK(gpt3.at(215 * 1536, 1536) == Approx(3e-5));
  CHECK(gpt3.at(430 * 1536, 1536) == Approx(6e-5));
  CHECK(gpt3.at(430000 * int64_t{1536}, 1536) == Approx(6e-6));
  // Sample-based: a warm-up of 100 samples, decay over 1100; the batch size does not enter.
  LearningRateSchedule samples;
  samples.max_lr = 1e-3;
  samples.warmup_samples = 100;
  samples.decay_samples = 1100;
  samples.validate();
  CHECK(samples.at(50, 8) == Approx(5e-4));
  CHECK(samples.at(600, 8) == Approx(5e-4));  // linear, halfway through the decay
  CHECK(samples.at(2000, 8) == Approx(0.0));
}

TEST_CASE("Megatron's exclusive learning-rate forms are refused together", "[train]") {
  LearningRateSchedule schedule;
  schedule.warmup_fraction = 0.01;
  schedule.warmup_iterations = 10;
  schedule.decay_iterations = 100;
  CHECK_THROWS_WITH(schedule.validate(), Catch::Matchers::Contains("--lr-warmup-fraction: cannot be combined"));
  schedule.warmup_iterations = 0;
  schedule.warmup_fraction = 1.5;
  CHECK_THROWS_WITH(schedule.validate(), Catch::Matchers::Contains("--lr-warmup-fraction: must lie in [0, 1]"));
  schedule.warmup_fraction.reset();
  schedule.warmup_samples = 10;
  CHECK_THROWS_WITH(schedule.validate(), Catch::Matchers::Contains("--lr-warmup-samples: is sample-based"));
}
