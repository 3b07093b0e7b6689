// The CPU trainer end to end on a generated corpus: a tiny GPT's and a tiny Llama's loss falls by
// at least 30% in 40 iterations, and a run resumed with --load from the checkpoint it saved halfway logs
// exactly the losses of the uninterrupted run; a non-finite loss stops it with the checkpoints intact.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/parallel_plan.h"
#include "executor/runtime/cpu_backend.h"
#include "executor/train/trainer.h"
#include "tests/executor/train/training_fixtures.h"

namespace {

megaplan::ParallelPlan one_rank(int64_t micro_batch_size, int64_t global_batch_size) {
  megaplan::ParallelPlan plan;
  plan.micro_batch_size = micro_batch_size;
  plan.global_batch_size = global_batch_size;
  return plan;
}

megaplan::exec::TrainSummary train_on_cpu(const megaplan::ParallelPlan& plan,
                                          const megaplan::exec::TrainOptions& options, std::ostream& out,
                                          const megaplan::ModelSpec& model = megaplan::test::tiny_gpt()) {
  return megaplan::exec::train(
      model, plan, options,
      [](int64_t) -> std::unique_ptr<megaplan::exec::Backend> {
        return std::make_unique<megaplan::exec::CpuBackend>();
      },
      out);
}

}  // namespace

TEST_CASE("a tiny GPT and a tiny Llama train on the CPU backend and resume exactly", "[train]") {
  using megaplan::test::logged_losses;
  const megaplan::test::ScratchDirectory scratch;
  const std::string corpus = megaplan::test::sentence_corpus(scratch);
  for (const megaplan::ModelSpec& model : {megaplan::test::tiny_gpt(), megaplan::test::tiny_llama()}) {
    INFO(model.name);
    megaplan::exec::TrainOptions options;
    options.train_iters = 40;
    const megaplan::ParallelPlan plan = one_rank(4, 8);
    options.learning_rate.max_lr = 3e-3;
    options.learning_rate.min_lr = 3e-4;
    options.learning_rate.warmup_iterations = 4;
    options.learning_rate.style = megaplan::exec::DecayStyle::kCosine;
    options.log_interval = 1;
    options.eval_interval = 20;
    options.eval_iters = 1;
    options.split = "9,1,0";
    options.data_path = corpus;
    std::ostringstream out;

    // The whole run saves at iteration 20 (and 40) on its way.
    options.log_file = scratch.file(model.name + "-whole.jsonl");
    options.save = scratch.file(model.name + "-checkpoints");
    options.save_interval = 20;
    train_on_cpu(plan, options, out, model);
    const std::vector<double> whole = logged_losses(*options.log_file);
    REQUIRE(whole.size() == 40);
    double last_five = 0;
    for (std::size_t i = 35; i < 40; ++i) last_five += whole[i] / 5;
    INFO("first loss " << whole.front() << ", mean of the last five " << last_five);
    CHECK(last_five <= 0.7 * whole.front());

    // Resumed from iteration 20's checkpoint alone, it logs the whole run's last 20 losses.
    const std::string twenty = scratch.file(model.name + "-at-20");
    std::filesystem::create_directories(twenty);
    std::filesystem::copy(*options.save + "/iter_0000020", twenty + "/iter_0000020",
                          std::filesystem::copy_options::recursive);
    options.log_file = scratch.file(model.name + "-resumed.jsonl");
    options.save.reset();
    options.save_interval = 0;
    options.load = twenty;
    const megaplan::exec::TrainSummary resumed = train_on_cpu(plan, options, out, model);
    CHECK(resumed.first_iteration == 21);
    CHECK(resumed.last_iteration == 40);
    const std::vector<double> parts = logged_losses(*options.log_file);
    REQUIRE(parts.size() == 20);
    for (std::size_t i = 0; i < 20; ++i) {
      INFO("iteration " << i + 21);
      CHECK(parts[i] == whole[i + 20]);  // bit for bit
    }
  }
}

TEST_CASE("a non-finite loss stops training before the optimizer step and keeps the last checkpoint", "[train]") {
  const megaplan::test::ScratchDirectory scratch;
  megaplan::exec::TrainOptions options;
  options.train_iters = 6;
  options.learning_rate.max_lr = 1e30;  // the first step throws the weights to infinity
  options.learning_rate.min_lr = 1e30;
  options.learning_rate.style = megaplan::exec::DecayStyle::kConstant;
  options.clip_grad = 0;
  options.log_interval = 1;
  options.eval_interval = 100;
  options.split = "1,0,0";
  options.data_path = megaplan::test::sentence_corpus(scratch);
  options.save = scratch.file("checkpoints");
  options.save_interval = 1;
  std::ostringstream out;
  try {
    train_on_cpu(one_rank(4, 4), options, out);
    FAIL("training went on with a non-finite loss");
  } catch (const megaplan::SpecError& error) {
    const std::string message = error.what();
    INFO(message);
    CHECK(message.find("iteration 2: ") != std::string::npos);
    CHECK(message.find("the first non-finite gradient on pipeline rank 0 is ") != std::string::npos);
  }
  // Iteration 1 was saved; iteration 2 never reached the optimizer or the disk.
  CHECK(std::filesystem::exists(scratch.file("checkpoints/iter_0000001")));
  CHECK_FALSE(std::filesystem::exists(scratch.file("checkpoints/iter_0000002")));
}

TEST_CASE("the log prints the interval's average loss, an ETA, a banner and validation records", "[trainer]") {
  const megaplan::test::ScratchDirectory scratch;
  megaplan::exec::TrainOptions options;
  options.train_iters = 4;
  options.eval_interval = 4;
  options.eval_iters = 1;
  options.split = "9,1,0";
  options.data_path = megaplan::test::sentence_corpus(scratch);
  const megaplan::ParallelPlan plan = one_rank(2, 4);
  // The same run logged every `interval` iterations into `file`: its logged losses.
  const auto logged = [&](int64_t interval, const std::string& file, std::ostream& out) {
    options.log_interval = interval;
    options.log_file = scratch.file(file);
    train_on_cpu(plan, options, out);
    return megaplan::test::logged_losses(*options.log_file);
  };
  std::ostringstream every_out, pairs_out;
  const std::vector<double> every = logged(1, "every.jsonl", every_out);
  REQUIRE(every.size() == 4);
  const std::vector<double> pairs = logged(2, "pairs.jsonl", pairs_out);
  REQUIRE(pairs.size() == 2);
  // Megatron's logged loss: the average over the interval's iterations (the same run, bit for bit).
  CHECK(pairs[0] == Approx((every[0] + every[1]) / 2).epsilon(1e-12));
  CHECK(pairs[1] == Approx((every[2] + every[3]) / 2).epsilon(1e-12));
  const std::string text = pairs_out.str();
  CHECK(text.find("training tiny-gpt, ") != std::string::npos);
  CHECK(text.find(" tokens per iteration, 4 iterations (") != std::string::npos);
  CHECK(text.find("| ETA ") != std::string::npos);
  CHECK(text.find("validation loss at iteration 4: ") != std::string::npos);
  CHECK(text.find(" | perplexity ") != std::string::npos);
  // The validation record of the log file.
  std::ifstream log(*options.log_file);
  std::string line, last;
  while (std::getline(log, line)) last = line;
  const nlohmann::json record = nlohmann::json::parse(last);
  CHECK(record.at("iteration") == 4);
  CHECK(record.at("validation_perplexity").get<double>() ==
        Approx(std::exp(record.at("validation_loss").get<double>())).epsilon(1e-12));
}

TEST_CASE("each update runs at the rate Megatron's scheduler holds after the updates before it", "[trainer]") {
  // Megatron's scheduler starts at 0 samples and steps after each update: under a warm-up of 4
  // iterations the first update runs at 0 (it moves Adam's moments, not the weights), the second
  // at a quarter of --lr, the fifth at --lr.
  const megaplan::test::ScratchDirectory scratch;
  megaplan::exec::TrainOptions options;
  options.train_iters = 6;
  options.learning_rate.max_lr = 1e-3;
  options.learning_rate.warmup_iterations = 4;
  options.learning_rate.style = megaplan::exec::DecayStyle::kConstant;
  options.log_interval = 1;
  options.eval_iters = 0;
  options.split = "1,0,0";
  options.data_path = megaplan::test::sentence_corpus(scratch);
  options.log_file = scratch.file("rates.jsonl");
  options.keep_final_weights = true;
  std::ostringstream out;
  train_on_cpu(one_rank(2, 4), options, out);
  std::vector<double> rates;
  std::ifstream log(*options.log_file);
  for (std::string line; std::getline(log, line);) rates.push_back(nlohmann::json::parse(line).at("lr").get<double>());
  REQUIRE(rates.size() == 6);
  CHECK(rates[0] == 0);
  CHECK(rates[1] == Approx(2.5e-4));
  CHECK(rates[2] == Approx(5e-4));
  CHECK(rates[4] == Approx(1e-3));
  CHECK(rates[5] == Approx(1e-3));
  // The first update at rate 0 leaves the weights where they started: one iteration ends on the
  // initialisation (Megatron's first step with a warm-up does the same).
  options.train_iters = 1;
  options.log_file = scratch.file("one.jsonl");
  const megaplan::exec::TrainSummary one = train_on_cpu(one_rank(2, 4), options, out);
  options.train_iters = 1;
  options.learning_rate.max_lr = 0;  // no update at all
  options.learning_rate.warmup_iterations = 0;
  options.log_file = scratch.file("none.jsonl");
  const megaplan::exec::TrainSummary none = train_on_cpu(one_rank(2, 4), options, out);
  CHECK(one.final_weights == none.final_weights);
}
