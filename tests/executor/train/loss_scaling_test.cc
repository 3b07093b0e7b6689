// Loss scaling as Megatron-LM runs it under --fp16: the scaler's rules (executor/train/loss_scaler.h)
// and the trainer around it on the CPU backend, which computes in fp32 but runs the scaler all the
// same. A power-of-two scale multiplies every gradient exactly, so a scaled run must log the
// unscaled run's losses bit for bit; an injected inf must skip its iteration (weights untouched),
// be counted and logged, back the scale off after --hysteresis overflows, and training go on.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/parallel_plan.h"
#include "executor/runtime/cpu_backend.h"
#include "executor/train/loss_scaler.h"
#include "executor/train/trainer.h"
#include "tests/executor/runtime/forwarding_backend.h"
#include "tests/executor/train/training_fixtures.h"
#include "tests/executor/train/training_run.h"

namespace {

namespace exec = megaplan::exec;
using megaplan::DType;
using megaplan::ParallelPlan;

constexpr double kTwo32 = 4294967296.0;

// Writes an inf into the first weight gradient of every backward in the chosen iterations (counted
// by the gradient norms taken: one per iteration on each rank), as an fp16 overflow would.
class OverflowingBackend final : public megaplan::test::ForwardingBackend {
 public:
  explicit OverflowingBackend(std::set<int64_t> iterations)
      : ForwardingBackend(std::make_unique<exec::CpuBackend>()), iterations_(std::move(iterations)) {}
  void linear_backward(ConstActivation dy, ConstActivation x, ConstActivation w, std::size_t m, std::size_t k,
                       std::size_t n, Activation dx, float* dw, float* db) override {
    ForwardingBackend::linear_backward(dy, x, w, m, k, n, dx, dw, db);
    if (dw && iterations_.count(norms_ + 1)) dw[0] = INFINITY;  // host memory on the CPU backend
  }
  double gradient_sum_of_squares(const std::vector<OptimizerTensor>& tensors) override {
    ++norms_;
    return ForwardingBackend::gradient_sum_of_squares(tensors);
  }

 private:
  std::set<int64_t> iterations_;
  int64_t norms_ = 0;
};

exec::BackendFactory cpu_backends() {
  return [](int64_t) -> std::unique_ptr<exec::Backend> { return std::make_unique<exec::CpuBackend>(); };
}

exec::BackendFactory overflowing(std::set<int64_t> iterations) {
  return [iterations](int64_t) -> std::unique_ptr<exec::Backend> {
    return std::make_unique<OverflowingBackend>(iterations);
  };
}

ParallelPlan plan_of(int64_t tp, int64_t pp, int64_t dp, bool distributed, DType precision) {
  ParallelPlan plan;
  plan.tensor_parallel_size = tp;
  plan.pipeline_parallel_size = pp;
  plan.data_parallel_size = dp;
  plan.use_distributed_optimizer = distributed;
  plan.micro_batch_size = 2;
  plan.global_batch_size = 8;
  plan.options.precision = precision;
  return plan;
}

exec::TrainOptions options_for(const std::string& corpus, int64_t iterations) {
  exec::TrainOptions options;
  options.train_iters = iterations;
  options.learning_rate.max_lr = 3e-3;
  options.learning_rate.warmup_iterations = 2;
  options.log_interval = 1;
  options.eval_interval = 100;
  options.eval_iters = 0;
  options.split = "1,0,0";
  options.data_path = corpus;
  options.keep_final_weights = true;
  return options;
}

// One field of every logged iteration's record.
std::vector<double> logged(const std::string& path, const char* key) {
  std::vector<double> values;
  std::ifstream log(path);
  std::string line;
  while (std::getline(log, line)) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record.contains(key)) values.push_back(record.at(key).get<double>());
  }
  return values;
}

}  // namespace

TEST_CASE("the dynamic loss scaler backs off after --hysteresis overflows and grows after a clean window",
          "[loss_scaler]") {
  exec::LossScalerSettings settings;
  settings.initial = 1024;
  settings.minimum = 256;
  settings.window = 3;
  settings.hysteresis = 2;
  exec::LossScaler scaler(settings);
  CHECK(scaler.dynamic());
  CHECK(scaler.scale() == 1024);
  scaler.update(true);  // one unit of hysteresis spent
  CHECK(scaler.scale() == 1024);
  scaler.update(true);  // used up: halve
  CHECK(scaler.scale() == 512);
  scaler.update(true);  // still used up (only growth restores it): halve again
  CHECK(scaler.scale() == 256);
  scaler.update(true);  // not below the minimum
  CHECK(scaler.scale() == 256);
  scaler.update(false);
  scaler.update(false);
  CHECK(scaler.scale() == 256);
  scaler.update(true);  // an overflow restarts the window
  scaler.update(false);
  scaler.update(false);
  CHECK(scaler.scale() == 256);
  scaler.update(false);  // three clean in a row: double, hysteresis restored
  CHECK(scaler.scale() == 512);
  CHECK(scaler.state().hysteresis_tracker == 2);
  scaler.update(true);
  CHECK(scaler.scale() == 512);

  exec::LossScalerSettings constant;
  constant.constant = 128;
  exec::LossScaler fixed(constant);
  CHECK_FALSE(fixed.dynamic());
  fixed.update(true);
  fixed.update(true);
  CHECK(fixed.scale() == 128);
}

TEST_CASE("loss-scaler flags out of range are refused naming the flag", "[loss_scaler]") {
  const auto refused = [](exec::LossScalerSettings settings, const char* flag) {
    INFO(flag);
    CHECK_THROWS_WITH(settings.validate(), Catch::Matchers::Contains(flag));
  };
  exec::LossScalerSettings s;
  s.constant = 0;
  refused(s, "--loss-scale");
  s = {};
  s.initial = -1;
  refused(s, "--initial-loss-scale");
  s = {};
  s.minimum = 2 * s.initial;
  refused(s, "--min-loss-scale");
  s = {};
  s.window = 0;
  refused(s, "--loss-scale-window");
  s = {};
  s.hysteresis = 0;
  refused(s, "--hysteresis");
}

TEST_CASE("fp16's loss scaling on the CPU backend logs the unscaled run's losses bit for bit", "[train][loss_scaler]") {
  const megaplan::test::ScratchDirectory scratch;
  const std::string corpus = megaplan::test::sentence_corpus(scratch);
  const megaplan::ModelSpec model = megaplan::test::four_layer_gpt();
  struct Layout {
    int64_t tp, pp, dp;
    bool distributed;
  };
  for (const Layout layout : {Layout{1, 1, 1, false}, Layout{2, 2, 2, true}}) {
    const std::string name = "tp" + std::to_string(layout.tp) + "pp" + std::to_string(layout.pp);
    INFO(name);
    const exec::TrainOptions options = options_for(corpus, 6);
    const auto unscaled = megaplan::test::train_logged(
        model, plan_of(layout.tp, layout.pp, layout.dp, layout.distributed, DType::kBFloat16), options, scratch,
        name + "-bf16", cpu_backends());
    const auto scaled = megaplan::test::train_logged(
        model, plan_of(layout.tp, layout.pp, layout.dp, layout.distributed, DType::kFloat16), options, scratch,
        name + "-fp16", cpu_backends());
    REQUIRE(scaled.losses.size() == 6);
    CHECK(scaled.losses == unscaled.losses);
    CHECK(scaled.summary.final_weights == unscaled.summary.final_weights);
    CHECK(scaled.summary.skipped_iterations == 0);
    CHECK(logged(scratch.file(name + "-fp16.jsonl"), "loss_scale") == std::vector<double>(6, kTwo32));
    CHECK(scaled.out.find("| loss scale 4.29497e+09 | number of skipped iterations 0") != std::string::npos);
    CHECK(unscaled.out.find("loss scale") == std::string::npos);  // bf16 scales nothing

    exec::TrainOptions constant = options;
    constant.loss_scaling.constant = 1024;  // --loss-scale: under bf16 too, as Megatron
    const auto fixed = megaplan::test::train_logged(
        model, plan_of(layout.tp, layout.pp, layout.dp, layout.distributed, DType::kBFloat16), constant, scratch,
        name + "-constant", cpu_backends());
    CHECK(fixed.losses == unscaled.losses);
    CHECK(logged(scratch.file(name + "-constant.jsonl"), "loss_scale") == std::vector<double>(6, 1024));
  }
}

TEST_CASE("an overflowing iteration is skipped, counted and logged, the scale backs off, and training recovers",
          "[train][loss_scaler]") {
  const megaplan::test::ScratchDirectory scratch;
  const std::string corpus = megaplan::test::sentence_corpus(scratch);
  const megaplan::ModelSpec model = megaplan::test::four_layer_gpt();
  const ParallelPlan fp16 = plan_of(1, 1, 1, false, DType::kFloat16);

  // Iterations 3 and 4 overflow: the first spends the hysteresis, the second halves the scale.
  exec::TrainOptions options = options_for(corpus, 10);
  const auto run = megaplan::test::train_logged(model, fp16, options, scratch, "overflow", overflowing({3, 4}));
  CHECK(run.summary.skipped_iterations == 2);
  const std::string log = scratch.file("overflow.jsonl");
  CHECK(logged(log, "skipped_iterations") == std::vector<double>{0, 0, 1, 1, 0, 0, 0, 0, 0, 0});
  CHECK(logged(log, "loss_scale") == std::vector<double>{kTwo32, kTwo32, kTwo32, kTwo32 / 2, kTwo32 / 2, kTwo32 / 2,
                                                         kTwo32 / 2, kTwo32 / 2, kTwo32 / 2, kTwo32 / 2});
  CHECK(run.out.find("iteration 4/10 | ") != std::string::npos);
  CHECK(run.out.find("| loss scale 2.14748e+09 | number of skipped iterations 1") != std::string::npos);
  REQUIRE(run.losses.size() == 10);
  for (const double loss : run.losses) CHECK(std::isfinite(loss));
  CHECK(run.losses.back() < run.losses.front());  // it went on learning

  // A skipped iteration leaves the weights and Adam's moments as they were: the checkpoints before
  // and after it hold the same bytes, and the later one records the skip and the scaler.
  options.train_iters = 3;
  options.save = scratch.file("checkpoints");
  options.save_interval = 1;
  const auto skipped = megaplan::test::train_logged(model, fp16, options, scratch, "skipped", overflowing({3}));
  CHECK(skipped.summary.skipped_iterations == 1);
  const auto bytes = [&](const std::string& file) {
    std::ifstream in(scratch.file("checkpoints/" + file), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string before = bytes("iter_0000002/mp_rank_00/model.bin");
  REQUIRE_FALSE(before.empty());
  CHECK(bytes("iter_0000003/mp_rank_00/model.bin") == before);
  CHECK(bytes("iter_0000001/mp_rank_00/model.bin") != before);  // an update does change them
  const nlohmann::json state = nlohmann::json::parse(bytes("iter_0000003/state.json"));
  CHECK(state.at("skipped_iterations") == 1);
  CHECK(state.at("loss_scaler").at("scale") == kTwo32);
  CHECK(state.at("loss_scaler").at("hysteresis_tracker") == 1);
  options.save.reset();
  options.save_interval = 0;

  // Without a scaler (bf16) the same overflow stops the run, as any non-finite gradient does.
  options.train_iters = 4;
  CHECK_THROWS_WITH(megaplan::test::train_logged(model, plan_of(1, 1, 1, false, DType::kBFloat16), options, scratch,
                                                 "bf16", overflowing({3})),
                    Catch::Matchers::Contains("iteration 3: the gradient norm is inf"));
}

TEST_CASE("a run resumed after skipped iterations scales, schedules and steps as an uninterrupted one",
          "[train][loss_scaler]") {
  const megaplan::test::ScratchDirectory scratch;
  const std::string corpus = megaplan::test::sentence_corpus(scratch);
  const megaplan::ModelSpec model = megaplan::test::four_layer_gpt();
  const ParallelPlan fp16 = plan_of(1, 1, 1, false, DType::kFloat16);
  exec::TrainOptions options = options_for(corpus, 8);
  options.loss_scaling.hysteresis = 1;  // every overflow halves the scale
  const auto whole = megaplan::test::train_logged(model, fp16, options, scratch, "whole", overflowing({2, 3}));

  // Stopped after the skips (a fresh backend counts iterations from the resumed one).
  options.save = scratch.file("checkpoints");
  options.exit_interval = 4;
  (void)megaplan::test::train_logged(model, fp16, options, scratch, "first", overflowing({2, 3}));
  options.exit_interval = 0;
  options.load = options.save;
  const auto rest = megaplan::test::train_logged(model, fp16, options, scratch, "rest", cpu_backends());
  REQUIRE(whole.losses.size() == 8);
  REQUIRE(rest.losses.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) CHECK(rest.losses[i] == whole.losses[4 + i]);
  CHECK(rest.summary.final_weights == whole.summary.final_weights);
  CHECK(logged(scratch.file("rest.jsonl"), "loss_scale") == std::vector<double>(4, kTwo32 / 4));
}
