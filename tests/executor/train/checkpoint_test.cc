// Per-rank checkpoints: Megatron's directory layout, a bit-exact resume under the saving layout,
// loading under other layouts (pipeline, virtual pipeline, data parallelism, the distributed
// optimizer on or off, tensor and sequence parallelism) on the single-rank trajectory, the tensor-parallel resharding
// rule, the vocabulary under another tp's padding, the tokenizer a run names, and refusals (a corrupted shard, a
// checkpoint of another model) and failed saves that leave the last good checkpoint as it was. A 4-layer GPT on the CPU
// backend, ranks as threads.
//
// Tolerance of a resharded load: the tolerance parallel_training_test.cc states and explains
// (1e-4 relative on losses): after the load each layout runs its own order of the same sums.
#include <catch2/catch.hpp>

#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/parallel_plan.h"
#include "core/parameter_list.h"
#include "core/text_file.h"
#include "executor/model/stage_chunk.h"
#include "executor/model/tensor_shards.h"
#include "executor/runtime/cpu_backend.h"
#include "executor/train/checkpoint.h"
#include "executor/train/optimizer.h"
#include "executor/train/trainer.h"
#include "tests/executor/runtime/forwarding_backend.h"
#include "tests/executor/train/checkpoint_fixtures.h"
#include "tests/executor/train/training_fixtures.h"
#include "tests/executor/train/training_run.h"

namespace {

using megaplan::ParallelPlan;
using megaplan::ScheduleKind;
namespace exec = megaplan::exec;
namespace fs = std::filesystem;

using megaplan::test::four_layer_gpt;

ParallelPlan plan_of(int64_t pp, int64_t dp, int64_t vpp, ScheduleKind schedule, bool distributed_optimizer) {
  ParallelPlan plan = megaplan::test::layout(1, pp, dp, vpp, schedule);
  plan.use_distributed_optimizer = distributed_optimizer;
  return plan;
}

exec::BackendFactory cpu_backends() {
  return [](int64_t) -> std::unique_ptr<exec::Backend> { return std::make_unique<exec::CpuBackend>(); };
}

using megaplan::test::checkpoint_training_options;
using megaplan::test::files_under;
using megaplan::test::load_error;
using megaplan::test::Outcome;

Outcome train(const megaplan::ModelSpec& model, const ParallelPlan& plan, const exec::TrainOptions& options,
              const megaplan::test::ScratchDirectory& scratch, const std::string& name,
              const exec::BackendFactory& backends = cpu_backends()) {
  return megaplan::test::train_logged(model, plan, options, scratch, name, backends);
}

// A CPU backend that fails every download of more than a few values (what a checkpoint does with
// weights and moments; training downloads only scalars): a disk or device failing mid-save.
class FailingDownloads final : public megaplan::test::ForwardingBackend {
 public:
  FailingDownloads() : ForwardingBackend(std::make_unique<exec::CpuBackend>()) {}
  using ForwardingBackend::download;
  void download(float* host, const float* device, std::size_t n) override {
    if (n > 64) throw std::runtime_error("injected failure: a download of " + std::to_string(n) + " values");
    inner().download(host, device, n);
  }
};

}  // namespace

TEST_CASE("a checkpoint of pp 2 x dp 2 resumes bit for bit and loads under other layouts", "[checkpoint]") {
  const megaplan::test::ScratchDirectory scratch;
  const megaplan::ModelSpec model = four_layer_gpt();
  exec::TrainOptions options = checkpoint_training_options(megaplan::test::sentence_corpus(scratch));
  const ParallelPlan saving = plan_of(2, 2, 1, ScheduleKind::kOneFOneB, true);
  const Outcome single = train(model, plan_of(1, 1, 1, ScheduleKind::kOneFOneB, false), options, scratch, "single");
  const Outcome whole = train(model, saving, options, scratch, "whole");
  REQUIRE(single.losses.size() == 8);
  REQUIRE(whole.losses.size() == 8);

  const std::string directory = scratch.file("checkpoints");
  options.save = directory;
  options.exit_interval = 4;
  CHECK(train(model, saving, options, scratch, "first-half").summary.last_iteration == 4);
  // Megatron's layout: one directory per pipeline rank (tp rank 00), written by data-parallel rank 0.
  CHECK(megaplan::read_file_contents(directory + "/latest_checkpointed_iteration.txt") == "4\n");
  for (const char* file : {"state.json", "mp_rank_00_000/model.bin", "mp_rank_00_000/manifest.json",
                           "mp_rank_00_001/model.bin", "mp_rank_00_001/manifest.json"}) {
    CHECK(fs::exists(directory + "/iter_0000004/" + file));
  }
  CHECK_FALSE(fs::exists(directory + "/iter_0000004.tmp"));
  const nlohmann::json state =
      nlohmann::json::parse(megaplan::read_file_contents(directory + "/iter_0000004/state.json"));
  CHECK(state.at("iteration") == 4);
  CHECK(state.at("consumed_samples") == 32);
  CHECK(state.at("plan").at("pipeline_parallel_size") == 2);
  CHECK(state.at("plan").at("use_distributed_optimizer") == true);
  const nlohmann::json manifest =
      nlohmann::json::parse(megaplan::read_file_contents(directory + "/iter_0000004/mp_rank_00_001/manifest.json"));
  bool tied_copy = false;
  for (const nlohmann::json& tensor : manifest.at("tensors")) {
    CHECK(tensor.at("dtype") == "float32");
    tied_copy = tied_copy || tensor.at("name") == "output_layer.weight";
  }
  CHECK(tied_copy);  // the last stage's own copy of the word embedding

  // Other layouts continue the single-rank trajectory (and save nothing here).
  options.exit_interval = 0;
  options.save.reset();
  options.load = directory;
  const std::vector<std::pair<std::string, ParallelPlan>> layouts = {
      {"one rank", plan_of(1, 1, 1, ScheduleKind::kOneFOneB, false)},
      {"pp 4", plan_of(4, 1, 1, ScheduleKind::kOneFOneB, false)},
      {"dp 2 without the distributed optimizer", plan_of(1, 2, 1, ScheduleKind::kOneFOneB, false)},
      {"pp 2 dualpipev (a V: the last stage reads the embedding, no copy)",
       plan_of(2, 1, 2, ScheduleKind::kDualPipeV, false)},
  };
  for (std::size_t l = 0; l < layouts.size(); ++l) {
    INFO(layouts[l].first);
    const Outcome resumed = train(model, layouts[l].second, options, scratch, "layout" + std::to_string(l));
    CHECK(resumed.summary.first_iteration == 5);
    CHECK(resumed.out.find("loaded " + directory + " at iteration 4") != std::string::npos);
    REQUIRE(resumed.losses.size() == 4);
    for (std::size_t i = 0; i < 4; ++i) {
      INFO("iteration " << i + 5);
      CHECK(resumed.losses[i] == Approx(single.losses[i + 4]).epsilon(1e-4));
    }
  }

  // The saving layout repeats the uninterrupted run bit for bit, and saves again; every tensor is
  // read as saved (streamed to the device), none resharded.
  options.save = directory;
  const Outcome resumed = train(model, saving, options, scratch, "second-half");
  CHECK(resumed.out.find(" tensors as saved, 0 resharded)") != std::string::npos);
  REQUIRE(resumed.losses.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) {
    INFO("iteration " << i + 5);
    CHECK(resumed.losses[i] == whole.losses[i + 4]);
  }
  CHECK(megaplan::read_file_contents(directory + "/latest_checkpointed_iteration.txt") == "8\n");
}

namespace {

// Trains `model` (the Mixtral-like fixture by default) 8 iterations at `saving`, whole and in two
// halves through a checkpoint at iteration 4 (`inspect` reads its directory first): the second half
// repeats the whole run's bit for bit, and each of `loading` continues the checkpoint as the single
// rank does (1e-4, the parallel layouts' tolerance).
void check_moe_checkpoint(const ParallelPlan& saving, const std::vector<std::pair<std::string, ParallelPlan>>& loading,
                          const std::function<void(const std::string& directory)>& inspect,
                          const megaplan::ModelSpec& model = megaplan::test::four_layer_mixtral()) {
  const megaplan::test::ScratchDirectory scratch;
  exec::TrainOptions options = checkpoint_training_options(megaplan::test::sentence_corpus(scratch));
  const Outcome single = train(model, plan_of(1, 1, 1, ScheduleKind::kOneFOneB, false), options, scratch, "single");
  const Outcome whole = train(model, saving, options, scratch, "whole");
  REQUIRE(whole.losses.size() == 8);

  const std::string directory = scratch.file("checkpoints");
  options.save = directory;
  options.exit_interval = 4;
  CHECK(train(model, saving, options, scratch, "first-half").summary.last_iteration == 4);
  inspect(directory + "/iter_0000004");

  options.exit_interval = 0;
  options.save.reset();
  options.load = directory;
  const Outcome resumed = train(model, saving, options, scratch, "second-half");
  REQUIRE(resumed.losses.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) {
    INFO("iteration " << i + 5);
    CHECK(resumed.losses[i] == whole.losses[i + 4]);
  }
  for (const auto& [name, plan] : loading) {
    INFO(name);
    const Outcome loaded = train(model, plan, options, scratch, name);
    REQUIRE(loaded.losses.size() == 4);
    for (std::size_t i = 0; i < 4; ++i) {
      INFO("iteration " << i + 5);
      CHECK(loaded.losses[i] == Approx(single.losses[i + 4]).epsilon(1e-4));
    }
  }
}

// The tensors a rank directory of a saved iteration holds, by name.
std::set<std::string> saved_names(const std::string& rank_directory) {
  std::set<std::string> held;
  const nlohmann::json manifest =
      nlohmann::json::parse(megaplan::read_file_contents(rank_directory + "/manifest.json"));
  for (const nlohmann::json& tensor : manifest.at("tensors")) held.insert(tensor.at("name").get<std::string>());
  return held;
}

}  // namespace

TEST_CASE("a checkpoint of an MoE model at pp 2 x dp 2 resumes bit for bit and loads at one rank",
          "[checkpoint][moe]") {
  // The router and every expert are parameters like the rest (Megatron-Core's names): saved by
  // their pipeline rank, read back whole or into another layout's stages.
  check_moe_checkpoint(plan_of(2, 2, 1, ScheduleKind::kOneFOneB, true),
                       {{"one", plan_of(1, 1, 1, ScheduleKind::kOneFOneB, false)}}, [](const std::string& iteration) {
                         CHECK(saved_names(iteration + "/mp_rank_00_000")
                                   .count("decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight") == 1);
                       });
}

TEST_CASE("a checkpoint of an MoE model at ep 2 resumes bit for bit and loads at ep 1 and ep 4", "[checkpoint][moe]") {
  // Each expert-parallel rank writes its experts (replica 0 of their expert data-parallel group)
  // into a directory of its own, mp_rank_TT_PPP_EEE as Megatron names it; the rest is written
  // once. A load finds every expert by its name wherever it was saved.
  ParallelPlan saving = plan_of(2, 2, 1, ScheduleKind::kOneFOneB, true);  // pp 2 x dp 2, ep 2 within dp
  saving.expert_model_parallel_size = 2;
  ParallelPlan four = plan_of(1, 4, 1, ScheduleKind::kOneFOneB, true);
  four.expert_model_parallel_size = 4;
  check_moe_checkpoint(saving, {{"one", plan_of(1, 1, 1, ScheduleKind::kOneFOneB, false)}, {"ep4", four}},
                       [](const std::string& iteration) {
                         const std::string expert = "decoder.layers.0.mlp.experts.local_experts.";
                         for (const std::string stage : {"000", "001"}) {
                           const std::set<std::string> first = saved_names(iteration + "/mp_rank_00_" + stage + "_000");
                           const std::set<std::string> second =
                               saved_names(iteration + "/mp_rank_00_" + stage + "_001");
                           CHECK(second.size() < first.size());  // experts only
                           for (const std::string& name : second)
                             CHECK(name.find(".mlp.experts.local_experts.") != std::string::npos);
                           if (stage == "000") {
                             CHECK(first.count(expert + "1.linear_fc1.weight") == 1);
                             CHECK(first.count(expert + "2.linear_fc1.weight") == 0);
                             CHECK(second.count(expert + "2.linear_fc1.weight") == 1);
                             CHECK(first.count("decoder.layers.0.mlp.router.weight") == 1);
                           }
                         }
                       });
}

TEST_CASE("a checkpoint of an MoE model at tp 2 x ep 2 resumes bit for bit and loads at one rank",
          "[checkpoint][moe]") {
  // Each tp rank saves its shard of every expert it holds (fc1's gate and up rows, fc2's columns)
  // as of a dense MLP; the router is whole on each. A load cuts them for its own layout.
  ParallelPlan saving = plan_of(1, 2, 1, ScheduleKind::kOneFOneB, true);  // tp 2 x dp 2, ep 2 within dp
  saving.tensor_parallel_size = 2;
  saving.sequence_parallel = true;
  saving.expert_model_parallel_size = 2;
  check_moe_checkpoint(saving, {{"one", plan_of(1, 1, 1, ScheduleKind::kOneFOneB, false)}},
                       [](const std::string& iteration) {
                         const std::string expert = "decoder.layers.0.mlp.experts.local_experts.";
                         for (const std::string tp : {"00", "01"}) {
                           const std::set<std::string> first = saved_names(iteration + "/mp_rank_" + tp + "_000");
                           const std::set<std::string> second = saved_names(iteration + "/mp_rank_" + tp + "_001");
                           CHECK(first.count(expert + "1.linear_fc1.weight") == 1);
                           CHECK(second.count(expert + "2.linear_fc2.weight") == 1);
                         }
                       });
}

TEST_CASE("a checkpoint of whole experts under tp 2 (etp 1) resumes bit for bit and loads cut over tp and at one rank",
          "[checkpoint][moe]") {
  // At etp 1 the ep group is the tp pair (Megatron's expert generator): tp rank t is ep rank t and
  // writes its experts whole (replica 0 of their expert data-parallel group) beside its dense
  // shards, into mp_rank_0t_00t. A load at etp = tp cuts them as a dense MLP's; one rank reads them
  // whole.
  ParallelPlan saving = plan_of(1, 2, 1, ScheduleKind::kOneFOneB, true);  // tp 2 x dp 2, ep 2 over tp x dp
  saving.tensor_parallel_size = 2;
  saving.sequence_parallel = true;
  saving.expert_model_parallel_size = 2;
  saving.expert_tensor_parallel_size = 1;
  ParallelPlan cut = saving;
  cut.expert_tensor_parallel_size = 0;
  check_moe_checkpoint(saving, {{"one", plan_of(1, 1, 1, ScheduleKind::kOneFOneB, false)}, {"etp 2", cut}},
                       [](const std::string& iteration) {
                         const std::string expert = "decoder.layers.0.mlp.experts.local_experts.";
                         const std::set<std::string> first = saved_names(iteration + "/mp_rank_00_000");
                         const std::set<std::string> second = saved_names(iteration + "/mp_rank_01_001");
                         CHECK(first.count(expert + "1.linear_fc1.weight") == 1);
                         CHECK(first.count(expert + "2.linear_fc1.weight") == 0);
                         CHECK(second.count(expert + "2.linear_fc2.weight") == 1);
                         CHECK(second.count("decoder.layers.0.self_attention.linear_qkv.weight") == 1);
                         CHECK_FALSE(std::filesystem::exists(iteration + "/mp_rank_00_001"));
                       });
}

TEST_CASE("a checkpoint of experts cut over etp 2 under tp 4 resumes bit for bit and loads at etp 4 and one rank",
          "[checkpoint][moe]") {
  // Each etp pair of the tp group holds the experts' halves (tp ranks 0 and 2 the same half: the
  // expert data-parallel group), and a load at another cut or at one rank reshards them. Mixtral's
  // fixture with a query group a head (tp 4 cuts the heads), the vocabulary padded alike at tp 1 and 4.
  megaplan::ModelSpec model = megaplan::test::four_layer_mixtral();
  model.num_query_groups = model.num_attention_heads;
  model.make_vocab_size_divisible_by = 65;
  ParallelPlan saving = plan_of(1, 1, 1, ScheduleKind::kOneFOneB, false);
  saving.tensor_parallel_size = 4;
  saving.sequence_parallel = true;
  saving.expert_tensor_parallel_size = 2;
  ParallelPlan cut = saving;
  cut.expert_tensor_parallel_size = 0;
  check_moe_checkpoint(
      saving, {{"one", plan_of(1, 1, 1, ScheduleKind::kOneFOneB, false)}, {"etp 4", cut}},
      [](const std::string& iteration) {
        const std::string fc1 = "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight";
        // Each half once: written by the pair holding it first (tp ranks 0 and 1).
        for (const int tp_rank : {0, 1, 2, 3}) {
          INFO("tp rank " << tp_rank);
          const std::set<std::string> names = saved_names(iteration + "/mp_rank_0" + std::to_string(tp_rank));
          CHECK(names.count("decoder.layers.0.self_attention.linear_qkv.weight") == 1);
          CHECK(names.count(fc1) == (tp_rank < 2 ? 1 : 0));
        }
      },
      model);
}

TEST_CASE("a checkpoint keeps the expert biases, resumed at ep 2 bit for bit and continued at ep 1 and tp 2",
          "[checkpoint][moe]") {
  // The biases are state the next forward reads, not parameters: state.json holds them once, by
  // layer, whatever the layout (every rank of a stage holds the same), and a load sets them.
  ParallelPlan saving = plan_of(2, 2, 1, ScheduleKind::kOneFOneB, true);  // pp 2 x dp 2, ep 2 within dp
  saving.expert_model_parallel_size = 2;
  ParallelPlan tensor = plan_of(1, 1, 1, ScheduleKind::kOneFOneB, false);
  tensor.tensor_parallel_size = 2;
  tensor.sequence_parallel = true;
  check_moe_checkpoint(
      saving, {{"one", plan_of(1, 1, 1, ScheduleKind::kOneFOneB, false)}, {"tp2", tensor}},
      [](const std::string& iteration) {
        const nlohmann::json state = nlohmann::json::parse(megaplan::read_file_contents(iteration + "/state.json"));
        const nlohmann::json& biases = state.at("expert_biases");
        REQUIRE(biases.size() == 4);
        double moved = 0;
        for (const auto& [layer, values] : biases.items()) {
          REQUIRE(values.size() == 4);
          for (const nlohmann::json& value : values) moved = std::max(moved, std::abs(value.get<double>()));
        }
        CHECK(moved > 0);  // four updates moved them
      },
      megaplan::test::four_layer_balanced_moe());
}

TEST_CASE("a checkpoint of tp 2 x pp 2 resumes bit for bit and loads at one rank and at pp 4", "[checkpoint]") {
  const megaplan::test::ScratchDirectory scratch;
  const megaplan::ModelSpec model = four_layer_gpt();
  exec::TrainOptions options = checkpoint_training_options(megaplan::test::sentence_corpus(scratch));
  ParallelPlan saving = plan_of(2, 1, 1, ScheduleKind::kOneFOneB, false);
  saving.tensor_parallel_size = 2;
  saving.sequence_parallel = true;
  const Outcome single = train(model, plan_of(1, 1, 1, ScheduleKind::kOneFOneB, false), options, scratch, "single");
  const Outcome whole = train(model, saving, options, scratch, "whole");
  REQUIRE(whole.losses.size() == 8);

  const std::string directory = scratch.file("checkpoints");
  options.save = directory;
  options.exit_interval = 4;
  CHECK(train(model, saving, options, scratch, "first-half").summary.last_iteration == 4);
  // One directory per (tensor, pipeline) rank; a column-parallel tensor is saved as its part.
  for (const char* rank : {"mp_rank_00_000", "mp_rank_01_000", "mp_rank_00_001", "mp_rank_01_001"}) {
    CHECK(fs::exists(directory + "/iter_0000004/" + rank + "/model.bin"));
  }
  const nlohmann::json manifest =
      nlohmann::json::parse(megaplan::read_file_contents(directory + "/iter_0000004/mp_rank_01_000/manifest.json"));
  bool column_part = false;
  for (const nlohmann::json& tensor : manifest.at("tensors")) {
    if (tensor.at("name") != "decoder.layers.0.self_attention.linear_qkv.weight") continue;
    column_part = tensor.at("shard") == nlohmann::json{{"dim", 0}, {"index", 1}, {"count", 2}, {"chunks", 1}} &&
                  tensor.at("shape") == nlohmann::json::array({48, 32}) &&
                  tensor.at("global_shape") == nlohmann::json::array({96, 32});
  }
  CHECK(column_part);

  options.exit_interval = 0;
  options.save.reset();
  options.load = directory;
  for (const auto& [name, plan] :
       std::vector<std::pair<std::string, ParallelPlan>>{{"one rank", plan_of(1, 1, 1, ScheduleKind::kOneFOneB, false)},
                                                         {"pp 4", plan_of(4, 1, 1, ScheduleKind::kOneFOneB, false)}}) {
    INFO(name);
    const Outcome resumed = train(model, plan, options, scratch, name);
    // The tensor-parallel parts are joined (resharded); the replicated tensors are read as saved.
    CHECK(resumed.out.find(" 0 resharded)") == std::string::npos);
    CHECK(resumed.out.find(" 0 tensors as saved") == std::string::npos);
    REQUIRE(resumed.losses.size() == 4);
    for (std::size_t i = 0; i < 4; ++i) {
      INFO("iteration " << i + 5);
      CHECK(resumed.losses[i] == Approx(single.losses[i + 4]).epsilon(1e-4));
    }
  }
  const Outcome resumed = train(model, saving, options, scratch, "second-half");
  CHECK(resumed.out.find(" tensors as saved, 0 resharded)") != std::string::npos);
  REQUIRE(resumed.losses.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) CHECK(resumed.losses[i] == whole.losses[i + 4]);
}

TEST_CASE("a checkpoint of cp 2 x dp 2 resumes bit for bit and continues at cp 1 and cp 4", "[checkpoint]") {
  // Checkpoints do not depend on cp: every cp rank holds the whole model, replica 0 of the dp-cp
  // group writes it, and the distributed optimizer's shards (over dp x cp) are joined on saving.
  const megaplan::test::ScratchDirectory scratch;
  const megaplan::ModelSpec model = four_layer_gpt();
  exec::TrainOptions options = checkpoint_training_options(megaplan::test::sentence_corpus(scratch));
  const auto cp_of = [](int64_t cp, ParallelPlan plan) {
    plan.context_parallel_size = cp;
    return plan;
  };
  const ParallelPlan saving = cp_of(2, plan_of(1, 2, 1, ScheduleKind::kOneFOneB, true));
  const Outcome single = train(model, plan_of(1, 1, 1, ScheduleKind::kOneFOneB, false), options, scratch, "cp-single");
  const Outcome whole = train(model, saving, options, scratch, "cp-whole");
  REQUIRE(whole.losses.size() == 8);

  const std::string directory = scratch.file("cp-checkpoints");
  options.save = directory;
  options.exit_interval = 4;
  CHECK(train(model, saving, options, scratch, "cp-first-half").summary.last_iteration == 4);
  CHECK(files_under(directory + "/iter_0000004").size() > 0);
  CHECK(!fs::exists(directory + "/iter_0000004/mp_rank_01"));  // one model-parallel rank: tp 1, pp 1

  options.exit_interval = 0;
  options.save.reset();
  options.load = directory;
  const Outcome resumed = train(model, saving, options, scratch, "cp-second-half");
  REQUIRE(resumed.losses.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) CHECK(resumed.losses[i] == whole.losses[i + 4]);
  for (const auto& [name, plan] : std::vector<std::pair<std::string, ParallelPlan>>{
           {"cp1", plan_of(1, 1, 1, ScheduleKind::kOneFOneB, false)},
           {"cp4", cp_of(4, plan_of(1, 1, 1, ScheduleKind::kOneFOneB, false))}}) {
    INFO(name);
    const Outcome continued = train(model, plan, options, scratch, "cp-continued-" + name);
    REQUIRE(continued.losses.size() == 4);
    for (std::size_t i = 0; i < 4; ++i) {
      INFO("iteration " << i + 5);
      CHECK(continued.losses[i] == Approx(single.losses[i + 4]).epsilon(1e-4));
    }
  }
}

TEST_CASE("checkpoints hand a run from pp 2 interleaved to dp 2 with the distributed optimizer to pp 2",
          "[checkpoint]") {
  const megaplan::test::ScratchDirectory scratch;
  const megaplan::ModelSpec model = four_layer_gpt();
  exec::TrainOptions options = checkpoint_training_options(megaplan::test::sentence_corpus(scratch));
  const Outcome single = train(model, plan_of(1, 1, 1, ScheduleKind::kOneFOneB, false), options, scratch, "single");
  REQUIRE(single.losses.size() == 8);
  const std::vector<std::pair<ParallelPlan, int64_t>> legs = {
      // a layout and the iteration it stops at
      {plan_of(2, 1, 2, ScheduleKind::kInterleaved, false), 2},
      {plan_of(1, 2, 1, ScheduleKind::kOneFOneB, true), 4},
      // dp 2 saved no tied copy of the embedding: pp 2's last stage reads its copy from the embedding.
      {plan_of(2, 1, 1, ScheduleKind::kOneFOneB, false), 8},
  };
  std::vector<double> losses;
  for (std::size_t leg = 0; leg < legs.size(); ++leg) {
    INFO("leg " << leg);
    options.save = scratch.file("leg" + std::to_string(leg));
    options.exit_interval = legs[leg].second == 8 ? 0 : legs[leg].second;
    const Outcome run = train(model, legs[leg].first, options, scratch, "leg" + std::to_string(leg));
    CHECK(run.summary.last_iteration == legs[leg].second);
    losses.insert(losses.end(), run.losses.begin(), run.losses.end());
    options.load = options.save;
    if (leg == 0) {
      // Each pipeline rank's directory holds both of its chunks (stages 0 and 2, 1 and 3).
      const nlohmann::json manifest = nlohmann::json::parse(
          megaplan::read_file_contents(*options.save + "/iter_0000002/mp_rank_00_001/manifest.json"));
      CHECK(manifest.at("stages") == nlohmann::json::array({1, 3}));
    }
  }
  REQUIRE(losses.size() == 8);
  for (std::size_t i = 0; i < 8; ++i) {
    INFO("iteration " << i + 1);
    CHECK(losses[i] == Approx(single.losses[i]).epsilon(1e-4));
  }
}

TEST_CASE("a corrupted shard and a checkpoint of another model are refused with one line", "[checkpoint]") {
  const megaplan::test::ScratchDirectory scratch;
  const megaplan::ModelSpec model = four_layer_gpt();
  exec::TrainOptions options = checkpoint_training_options(megaplan::test::sentence_corpus(scratch));
  options.train_iters = 3;
  const ParallelPlan pp2 = plan_of(2, 1, 1, ScheduleKind::kOneFOneB, false);
  const std::string directory = scratch.file("checkpoints");
  options.save = directory;
  options.exit_interval = 2;
  (void)train(model, pp2, options, scratch, "saved");

  // One flipped byte inside decoder.layers.1.mlp.linear_fc1.weight (its first moment).
  const std::string rank_directory = directory + "/iter_0000002/mp_rank_00_000";
  const nlohmann::json manifest =
      nlohmann::json::parse(megaplan::read_file_contents(rank_directory + "/manifest.json"));
  const std::string corrupted = "decoder.layers.1.mlp.linear_fc1.weight";
  uint64_t offset = 0, size = 0;
  for (const nlohmann::json& tensor : manifest.at("tensors")) {
    if (tensor.at("name") == corrupted) {
      offset = tensor.at("offset").get<uint64_t>();
      size = 4 * 128 * 32;
      CHECK(tensor.at("shape") == nlohmann::json::array({128, 32}));
    }
  }
  REQUIRE(size > 0);
  const std::map<std::string, std::string> before = files_under(directory);
  {
    std::fstream file(rank_directory + "/model.bin", std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(offset + size + 1001));
    file.put('\x5a');
  }
  options.exit_interval = 0;
  options.load = directory;
  options.save_interval = 1;
  std::string message = load_error([&] { (void)train(model, pp2, options, scratch, "corrupted"); });
  INFO(message);
  CHECK(message.find(rank_directory + "/model.bin: checksum of " + corrupted + " does not match") != std::string::npos);
  CHECK(message.find('\n') == std::string::npos);
  // Nothing trained, logged or saved.
  CHECK_FALSE(fs::exists(scratch.file("corrupted.jsonl")));
  std::map<std::string, std::string> after = files_under(directory);
  after.erase("iter_0000002/mp_rank_00_000/model.bin");
  std::map<std::string, std::string> expected = before;
  expected.erase("iter_0000002/mp_rank_00_000/model.bin");
  CHECK(after == expected);

  // A checkpoint of a model with hidden size 64: every tensor has another shape.
  megaplan::ModelSpec wider = model;
  wider.hidden_size = 64;
  exec::TrainOptions other = options;
  other.train_iters = 1;
  other.learning_rate.warmup_iterations = 0;
  other.load.reset();
  other.save = scratch.file("wider");
  other.save_interval = 0;
  (void)train(wider, plan_of(1, 1, 1, ScheduleKind::kOneFOneB, false), other, scratch, "wider");
  options.load = other.save;
  message = load_error([&] { (void)train(model, pp2, options, scratch, "wider-loaded"); });
  CHECK(message ==
        "--load: " + *other.save +
            "/iter_0000001/mp_rank_00/manifest.json: decoder.final_layernorm.bias has global shape [64] in the "
            "checkpoint but [32] in the model");

  // A checkpoint of two layers lacks the model's layers 2 and 3.
  megaplan::ModelSpec shallower = model;
  shallower.num_layers = 2;
  other.save = scratch.file("shallower");
  (void)train(shallower, plan_of(1, 1, 1, ScheduleKind::kOneFOneB, false), other, scratch, "shallower");
  options.load = other.save;
  message = load_error([&] { (void)train(model, pp2, options, scratch, "shallower-loaded"); });
  CHECK(message.find("holds no decoder.layers.2.") != std::string::npos);
}

TEST_CASE("a rank directory of another iteration, rank or plan, a longer model.bin and a damaged replica are refused",
          "[checkpoint]") {
  const megaplan::test::ScratchDirectory scratch;
  const megaplan::ModelSpec model = four_layer_gpt();
  exec::TrainOptions options = checkpoint_training_options(megaplan::test::sentence_corpus(scratch));
  options.train_iters = 2;
  options.save_interval = 1;
  const ParallelPlan tp2 = megaplan::test::layout(2, 1, 1, 1, ScheduleKind::kOneFOneB);
  const std::string saved = scratch.file("saved");
  options.save = saved;
  (void)train(model, tp2, options, scratch, "saved");
  ParallelPlan tp2_sp = tp2;
  tp2_sp.sequence_parallel = true;
  options.save = scratch.file("saved-sp");
  (void)train(model, tp2_sp, options, scratch, "saved-sp");

  // Each case damages a fresh copy of `saved` and loads it at tp 2 (or reads its weights).
  const auto damaged_load = [&](const std::string& name, const std::function<void(const std::string&)>& damage,
                                const ParallelPlan& plan) {
    const std::string copy = scratch.file(name);
    fs::copy(saved, copy, fs::copy_options::recursive);
    damage(copy + "/iter_0000002");
    exec::TrainOptions load = options;
    load.save.reset();
    load.save_interval = 0;
    load.load = copy;
    const std::string message = load_error([&] { (void)train(model, plan, load, scratch, name); });
    CHECK(message.find('\n') == std::string::npos);
    CHECK_FALSE(fs::exists(scratch.file(name + ".jsonl")));  // nothing trained
    return message;
  };
  const auto replace_directory = [](const std::string& from, const std::string& to) {
    fs::remove_all(to);
    fs::copy(from, to, fs::copy_options::recursive);
  };

  std::string message = damaged_load(
      "other-iteration",
      [&](const std::string& iteration) {
        replace_directory(saved + "/iter_0000001/mp_rank_01", iteration + "/mp_rank_01");
      },
      tp2);
  INFO(message);
  CHECK(message.find("iter_0000002/mp_rank_01/manifest.json: iteration: saved at iteration 1, but ") !=
        std::string::npos);
  CHECK(message.find("(a rank directory of another checkpoint: copied or moved)") != std::string::npos);

  message = damaged_load(
      "other-rank",
      [&](const std::string& iteration) {
        fs::rename(iteration + "/mp_rank_00", iteration + "/swap");
        fs::rename(iteration + "/mp_rank_01", iteration + "/mp_rank_00");
        fs::rename(iteration + "/swap", iteration + "/mp_rank_01");
      },
      tp2);
  CHECK(message.find("mp_rank_00/manifest.json: directory: saved as \"mp_rank_01\", but it lies in mp_rank_00") !=
        std::string::npos);

  message = damaged_load(
      "other-plan",
      [&](const std::string& iteration) {
        replace_directory(*options.save + "/iter_0000002/mp_rank_01", iteration + "/mp_rank_01");
      },
      tp2);
  CHECK(message.find("mp_rank_01/manifest.json: plan: saved under another plan than state.json's") !=
        std::string::npos);

  message = damaged_load(
      "longer",
      [&](const std::string& iteration) {
        std::ofstream(iteration + "/mp_rank_01/model.bin", std::ios::binary | std::ios::app).put('\0');
      },
      tp2);
  const uint64_t size = fs::file_size(saved + "/iter_0000002/mp_rank_01/model.bin");
  CHECK(message.find("mp_rank_01/model.bin holds " + std::to_string(size + 1) + " bytes, its manifest's tensors " +
                     std::to_string(size)) != std::string::npos);

  // mp_rank_01's copy of a replicated tensor: a load at tp 1 reads mp_rank_00's, yet refuses it.
  const std::string replica = "decoder.final_layernorm.weight";
  const auto damage_replica = [&](const std::string& iteration) {
    const nlohmann::json manifest =
        nlohmann::json::parse(megaplan::read_file_contents(iteration + "/mp_rank_01/manifest.json"));
    for (const nlohmann::json& tensor : manifest.at("tensors")) {
      if (tensor.at("name") == replica) {
        megaplan::test::flip_byte(iteration + "/mp_rank_01/model.bin", tensor.at("offset").get<uint64_t>() + 4);
      }
    }
  };
  message = damaged_load("replica", damage_replica, megaplan::test::layout(1, 1, 1, 1, ScheduleKind::kOneFOneB));
  CHECK(message.find("mp_rank_01/model.bin: checksum of " + replica + " does not match") != std::string::npos);
  // Under the saving layout tp rank 1 reads its own copy; at dp 2 only the first replica checks.
  message = damaged_load("replica-tp2", damage_replica, megaplan::test::layout(2, 1, 2, 1, ScheduleKind::kOneFOneB));
  CHECK(message.find("mp_rank_01/model.bin: checksum of " + replica + " does not match") != std::string::npos);
  damage_replica(saved + "/iter_0000002");
  message = load_error([&] { (void)exec::read_checkpoint_weights(saved); });
  CHECK(message.find("mp_rank_01/model.bin: checksum of " + replica + " does not match") != std::string::npos);
}

TEST_CASE("a run saving into a folder another run holds is refused before it trains", "[checkpoint]") {
  const megaplan::test::ScratchDirectory scratch;
  exec::TrainOptions options = checkpoint_training_options(megaplan::test::sentence_corpus(scratch));
  options.train_iters = 1;
  options.learning_rate.warmup_iterations = 0;
  const ParallelPlan dp2 = plan_of(1, 2, 1, ScheduleKind::kOneFOneB, false);
  options.save = scratch.file("held");
  fs::create_directories(*options.save);
  const auto save_error = [&](const std::string& name) {
    try {
      (void)train(four_layer_gpt(), dp2, options, scratch, name);
    } catch (const megaplan::SpecError& error) {
      CHECK_FALSE(fs::exists(scratch.file(name + ".jsonl")));  // nothing trained
      return std::string(error.what());
    }
    FAIL("no SpecError");
    return std::string();
  };
  {
    const exec::FolderLock other_run(*options.save, exec::FolderLock::Wait::kNot);
    REQUIRE(other_run.held());
    CHECK(save_error("second") == "--save: " + *options.save +
                                      " is being saved into by another run (it holds the folder's lock); wait for it "
                                      "to end or give another folder");
  }
  (void)train(four_layer_gpt(), dp2, options, scratch, "after");  // the lock went with its holder
  CHECK(fs::exists(*options.save + "/iter_0000001"));

  // A run that stops before it saves removes the --save folder it created for its lock.
  options.save = scratch.file("fresh");
  options.data_path = scratch.file("no-such-corpus");
  CHECK(save_error("unread").find("--data-path") == 0);
  CHECK_FALSE(fs::exists(*options.save));
  // The index cache locks its own folder while it builds: never the --save folder.
  options.data_path = megaplan::test::sentence_corpus(scratch);
  options.data_cache_path = options.save;
  CHECK(save_error("cache") ==
        "--data-cache-path: is the --save folder, which the run holds locked: give each its own");
}

TEST_CASE("a save that fails on any rank leaves the last checkpoint as it was", "[checkpoint]") {
  const megaplan::test::ScratchDirectory scratch;
  const megaplan::ModelSpec model = four_layer_gpt();
  exec::TrainOptions options = checkpoint_training_options(megaplan::test::sentence_corpus(scratch));
  // Without the distributed optimizer a save communicates only at its barriers, so the failing
  // writer (pipeline rank 1's) fails while rank 0 goes on to the barrier before the rename.
  const ParallelPlan plan = plan_of(2, 2, 1, ScheduleKind::kOneFOneB, false);
  const std::string directory = scratch.file("checkpoints");
  options.save = directory;
  options.exit_interval = 4;
  (void)train(model, plan, options, scratch, "first");
  const std::map<std::string, std::string> before = files_under(directory);
  REQUIRE(before.count("latest_checkpointed_iteration.txt"));

  // Global rank 0 (which renames the directory and writes "latest") saves fine; every other rank
  // fails where it downloads its tensors.
  options.exit_interval = 0;
  options.load = directory;
  const exec::BackendFactory failing = [](int64_t rank) -> std::unique_ptr<exec::Backend> {
    if (rank == 0) return std::make_unique<exec::CpuBackend>();
    return std::make_unique<FailingDownloads>();
  };
  try {
    (void)train(model, plan, options, scratch, "failing", failing);
    FAIL("the save succeeded");
  } catch (const std::runtime_error& error) {
    INFO(error.what());
    CHECK(std::string(error.what()).find("injected failure") != std::string::npos);
  }
  CHECK_FALSE(fs::exists(directory + "/iter_0000008"));
  CHECK(files_under(directory) == before);  // latest still names iteration 4, whose files are unchanged

  // And the run resumes from it.
  options.train_iters = 5;
  options.save.reset();
  CHECK(train(model, plan, options, scratch, "resumed").summary.first_iteration == 5);
}

namespace {

// The SpecError a run ends with ("" when none), whatever its flag.
std::string refusal_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const megaplan::SpecError& error) {
    return error.what();
  }
  return "";
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << text;
}

}  // namespace

TEST_CASE("a checkpoint whose expert biases do not fit the model is refused in one line", "[checkpoint][moe]") {
  const megaplan::test::ScratchDirectory scratch;
  const megaplan::ModelSpec model = megaplan::test::four_layer_balanced_moe();
  exec::TrainOptions options = checkpoint_training_options(megaplan::test::sentence_corpus(scratch));
  const std::string directory = scratch.file("checkpoints");
  options.save = directory;
  options.train_iters = 2;
  const ParallelPlan one = plan_of(1, 1, 1, ScheduleKind::kOneFOneB, false);
  train(model, one, options, scratch, "saved");
  const std::string state_path = directory + "/iter_0000002/state.json";
  const nlohmann::json saved = nlohmann::json::parse(megaplan::read_file_contents(state_path));
  options.save.reset();
  options.load = directory;
  options.train_iters = 4;
  const auto refused = [&](const std::function<void(nlohmann::json&)>& damage, const std::string& expected) {
    nlohmann::json state = saved;
    damage(state);
    state.erase("fnv1a64");  // a state.json without its checksum loads (older formats)
    write_text(state_path, state.dump(2));
    INFO(expected);
    CHECK_THROWS_WITH(train(model, one, options, scratch, "loaded"), Catch::Contains(expected));
  };
  refused([](nlohmann::json& s) { s["expert_biases"].erase("2"); }, "has no bias for MoE layer 2");
  refused([](nlohmann::json& s) { s["expert_biases"]["1"].erase(0); }, "holds 3 biases for layer 1");
  refused([](nlohmann::json& s) { s["expert_biases"]["7"] = {0, 0, 0, 0}; }, "names a layer the model does not have");
  refused([](nlohmann::json& s) { s["expert_biases"]["x"] = {0}; }, "\"x\" is not a layer index");
  refused([](nlohmann::json& s) { s["expert_biases"]["0"][1] = "up"; }, "expert_biases.0: must be a list of numbers");
  refused([](nlohmann::json& s) { s["expert_biases"]["0"][1] = 1e300; }, "holds a non-finite bias for layer 0");
  refused([](nlohmann::json& s) { s.erase("expert_biases"); }, "has no bias for MoE layer 0");
}

TEST_CASE("a damaged training state, a missing latest file and bad --load/--save paths are refused before training",
          "[checkpoint]") {
  const megaplan::test::ScratchDirectory scratch;
  const megaplan::ModelSpec model = four_layer_gpt();
  const ParallelPlan plan = plan_of(1, 1, 1, ScheduleKind::kOneFOneB, false);
  exec::TrainOptions options = checkpoint_training_options(megaplan::test::sentence_corpus(scratch));
  options.train_iters = 2;
  options.save = scratch.file("saved");
  options.save_interval = 1;
  (void)train(model, plan, options, scratch, "saved");
  const std::string state_file = "/iter_0000002/state.json";
  const nlohmann::json state = nlohmann::json::parse(megaplan::read_file_contents(*options.save + state_file));
  REQUIRE(state.contains("fnv1a64"));

  // Each damage on a copy of the checkpoint, loaded by a run of 3 iterations.
  int copies = 0;
  const auto load_damaged = [&](const std::function<void(const std::string&)>& damage) {
    const std::string copy = scratch.file("copy" + std::to_string(copies++));
    fs::copy(*options.save, copy, fs::copy_options::recursive);
    damage(copy);
    exec::TrainOptions resumed = options;
    resumed.train_iters = 3;
    resumed.save.reset();
    resumed.save_interval = 0;
    resumed.load = copy;
    return refusal_of([&] { (void)train(model, plan, resumed, scratch, "damaged"); });
  };
  const auto with_state = [&](const std::function<void(nlohmann::json&)>& edit) {
    return [&, edit](const std::string& copy) {
      nlohmann::json edited = state;
      edit(edited);
      write_text(copy + state_file, edited.dump(2));
    };
  };
  // One changed digit anywhere in state.json is its checksum's to catch.
  CHECK(load_damaged(with_state([](nlohmann::json& s) {
          s["consumed_samples"] = 7;
        })).find("/state.json: its checksum does not match its contents") != std::string::npos);
  // The manifests carry one too: a changed shard index would otherwise load a permuted tensor.
  CHECK(load_damaged([](const std::string& copy) {
          const std::string path = copy + "/iter_0000002/mp_rank_00/manifest.json";
          nlohmann::json manifest = nlohmann::json::parse(megaplan::read_file_contents(path));
          manifest["tensors"][0]["offset"] = 4;
          write_text(path, manifest.dump(1));
        }).find("/iter_0000002/mp_rank_00/manifest.json: its checksum does not match its contents") !=
        std::string::npos);
  // Without the checksum (a checkpoint saved before it), each field is checked for itself.
  const auto unsummed = [&](const std::function<void(nlohmann::json&)>& edit) {
    return with_state([edit](nlohmann::json& s) {
      s.erase("fnv1a64");
      edit(s);
    });
  };
  CHECK(load_damaged(unsummed([](nlohmann::json& s) {
          s["consumed_samples"] = -8;
        })).find("state.json: consumed_samples: must be non-negative, got -8") != std::string::npos);
  CHECK(load_damaged(unsummed([](nlohmann::json& s) {
          s["iteration"] = "2";
        })).find("state.json: iteration: must be an integer, got string \"2\"") != std::string::npos);
  CHECK(load_damaged(unsummed([](nlohmann::json& s) {
          s["iteration"] = nlohmann::json::array({2});
        })).find("state.json: iteration: must be an integer, got array") != std::string::npos);
  CHECK(load_damaged(unsummed([](nlohmann::json& s) {
          s["iteration"] = 2.5;
        })).find("iteration: must be an integer, got number 2.5") != std::string::npos);
  CHECK(load_damaged(unsummed([](nlohmann::json& s) {
          s.erase("consumed_samples");
        })).find("state.json: consumed_samples: required field is missing") != std::string::npos);
  CHECK(load_damaged(unsummed([](nlohmann::json& s) { s["iteration"] = 3; })).find("state.json says iteration 3 but") !=
        std::string::npos);
  CHECK(load_damaged(unsummed([](nlohmann::json& s) {
          s["consumed_samples"] = int64_t{1} << 62;
        })).find("has consumed 4611686018427387904 samples, more than the ") != std::string::npos);
  CHECK(load_damaged([](const std::string& copy) { write_text(copy + "/latest_checkpointed_iteration.txt", "1e15\n"); })
            .find("latest_checkpointed_iteration.txt must hold an iteration number (up to 12 digits), and holds "
                  "\"1e15\"") != std::string::npos);
  // Without `latest` (a save killed between its rename and writing it), the newest complete
  // iteration directory loads; a staging directory beside it is not one.
  CHECK(load_damaged([](const std::string& copy) {
          fs::remove(copy + "/latest_checkpointed_iteration.txt");
          fs::create_directory(copy + "/iter_0000003.tmp");
        }) == "");
  // An incomplete newer one (a copy cut short) is passed over; with none complete, the load refuses.
  CHECK(load_damaged([](const std::string& copy) {
          fs::remove(copy + "/latest_checkpointed_iteration.txt");
          fs::create_directories(copy + "/iter_0000003/mp_rank_00");
          fs::copy_file(copy + "/iter_0000002/state.json", copy + "/iter_0000003/state.json");
        }) == "");
  CHECK(load_damaged([](const std::string& copy) {
          fs::remove(copy + "/latest_checkpointed_iteration.txt");
          fs::remove(copy + "/iter_0000001/state.json");
          fs::remove(copy + "/iter_0000002/mp_rank_00/model.bin");
        })
            .find(" holds no complete checkpoint, and no latest_checkpointed_iteration.txt: iter_0000002 (no "
                  "mp_rank_00/model.bin), iter_0000001 (no state.json)") != std::string::npos);
  // Files that are not a checkpoint's: a link to a device, a loop of links, a state.json of 1 GB.
  CHECK(load_damaged([&](const std::string& copy) {
          fs::remove(copy + state_file);
          fs::create_symlink("/dev/zero", copy + state_file);
        }).find("/state.json: is a device, not a regular file") != std::string::npos);
  CHECK(load_damaged([](const std::string& copy) {
          const std::string latest = copy + "/latest_checkpointed_iteration.txt";
          fs::remove(latest);
          fs::create_symlink(latest, latest);
        }).find("latest_checkpointed_iteration.txt: Too many levels of symbolic links") != std::string::npos);
  CHECK(load_damaged([&](const std::string& copy) {
          fs::resize_file(copy + state_file, uintmax_t{1} << 30);
        }).find("/state.json: holds more than 268435456 bytes") != std::string::npos);
  // A checkpoint past the run's last iteration has nothing to train.
  options.load = options.save;
  options.save.reset();
  options.save_interval = 0;
  options.train_iters = 1;
  options.learning_rate.warmup_iterations = 0;
  const std::string past = refusal_of([&] { (void)train(model, plan, options, scratch, "past"); });
  INFO(past);
  CHECK(past.find("is at iteration 2, past --train-iters 1: nothing to train") != std::string::npos);
  options.train_iters = 3;
  options.learning_rate.warmup_iterations = 2;

  // --load of a directory that does not exist: an error, unless it is also --save.
  options.load = scratch.file("nowhere");
  CHECK(refusal_of([&] { (void)train(model, plan, options, scratch, "nowhere"); }) ==
        "--load: " + *options.load +
            " does not exist; to start from scratch and resume from it later, give the same "
            "directory to --save (Megatron's resume-or-start idiom)");
  options.save = options.load;
  const Outcome started = train(model, plan, options, scratch, "resume-or-start");
  CHECK(started.out.find("no checkpoint in " + *options.load + " yet: starting from scratch") != std::string::npos);
  CHECK(started.summary.first_iteration == 1);
  // An empty directory that is not --save holds nothing to resume.
  fs::create_directory(scratch.file("empty"));
  options.load = scratch.file("empty");
  options.save = scratch.file("elsewhere");
  CHECK(refusal_of([&] {
          (void)train(model, plan, options, scratch, "empty");
        }).find(" holds no checkpoint (no latest_checkpointed_iteration.txt)") != std::string::npos);
  // --load naming a file; --save naming a file, or a directory under one: before any iteration.
  write_text(scratch.file("a-file"), "x");
  options.load = scratch.file("a-file");
  CHECK(refusal_of([&] { (void)train(model, plan, options, scratch, "load-file"); }) ==
        "--load: " + scratch.file("a-file") + " is not a directory");
  options.load.reset();
  options.save = scratch.file("a-file/checkpoints");
  CHECK(refusal_of([&] { (void)train(model, plan, options, scratch, "save-file"); }) ==
        "--save: " + scratch.file("a-file") + ", on the way to " + *options.save + ", is not a directory");
  CHECK_FALSE(fs::exists(scratch.file("save-file.jsonl")));  // nothing trained
}

TEST_CASE("a save over an existing iteration swaps it in whole and removes what interrupted saves left",
          "[checkpoint]") {
  const megaplan::test::ScratchDirectory scratch;
  const megaplan::ModelSpec model = four_layer_gpt();
  const ParallelPlan plan = plan_of(1, 1, 1, ScheduleKind::kOneFOneB, false);
  exec::TrainOptions options = checkpoint_training_options(megaplan::test::sentence_corpus(scratch));
  const std::string directory = scratch.file("checkpoints");
  options.train_iters = 2;
  options.save = directory;
  options.save_interval = 1;
  (void)train(model, plan, options, scratch, "first");
  const std::map<std::string, std::string> first = files_under(directory);
  // What kills at each step of a save leave behind.
  fs::create_directory(directory + "/iter_0000009.tmp");
  write_text(directory + "/iter_0000009.tmp/state.json", "{");
  write_text(directory + "/latest_checkpointed_iteration.txt.tmp.Ab12Cd", "9");
  // Back to iteration 1, then train iteration 2 again: its save replaces the saved iteration 2.
  write_text(directory + "/latest_checkpointed_iteration.txt", "1\n");
  options.load = directory;
  (void)train(model, plan, options, scratch, "again");
  const std::map<std::string, std::string> second = files_under(directory);
  std::vector<std::string> names;
  for (const auto& [name, bytes] : second) names.push_back(name);
  std::vector<std::string> expected;
  for (const auto& [name, bytes] : first) expected.push_back(name);
  CHECK(names == expected);  // no temporaries, no staging directory left
  // The same run from the same state: the replaced iteration holds the same bytes.
  CHECK(second == first);
}

namespace {

// four_layer_gpt with 4 heads (tp 4 splits them) and a vocabulary that pads differently at each tp:
// make_vocab_size_divisible_by 64 pads the byte tokenizer's 257 to 320 rows at tp 1, 384 at tp 2
// and 512 at tp 4.
megaplan::ModelSpec padded_gpt() {
  megaplan::ModelSpec model = four_layer_gpt();
  model.name = "four-layer-gpt-4-heads";
  model.num_attention_heads = 4;
  model.make_vocab_size_divisible_by = 64;
  return model;
}

// A tensor's value, first and second moment, whole.
struct WholeArrays {
  std::vector<int64_t> global_shape;
  std::array<std::vector<float>, 3> arrays;
};

// `name` as the iteration directory `iteration` saved it, read from the files as checkpoint.h
// states their layout (each rank directory's manifest; model.bin: value, then the two moments)
// and its tensor-parallel parts joined.
WholeArrays saved_tensor(const std::string& iteration, const std::string& name) {
  std::map<int64_t, std::array<std::vector<float>, 3>> parts;
  exec::TensorCut cut;
  WholeArrays whole;
  for (const fs::directory_entry& entry : fs::directory_iterator(iteration)) {
    if (!entry.is_directory()) continue;
    const nlohmann::json manifest =
        nlohmann::json::parse(megaplan::read_file_contents(entry.path().string() + "/manifest.json"));
    for (const nlohmann::json& tensor : manifest.at("tensors")) {
      if (tensor.at("name") != name) continue;
      const nlohmann::json& shard = tensor.at("shard");
      cut.dim = shard.at("dim").is_null() ? -1 : shard.at("dim").get<int64_t>();
      cut.count = shard.at("count").get<int64_t>();
      cut.chunks = shard.at("chunks").get<int64_t>();
      whole.global_shape = tensor.at("global_shape").get<std::vector<int64_t>>();
      const std::size_t count = exec::elements(tensor.at("shape").get<std::vector<int64_t>>());
      std::ifstream data(entry.path().string() + "/model.bin", std::ios::binary);
      data.seekg(static_cast<std::streamoff>(tensor.at("offset").get<uint64_t>()));
      std::array<std::vector<float>, 3>& arrays = parts[shard.at("index").get<int64_t>()];
      for (std::vector<float>& array : arrays) {
        array.resize(count);
        data.read(reinterpret_cast<char*>(array.data()), static_cast<std::streamsize>(count * sizeof(float)));
      }
    }
  }
  REQUIRE(static_cast<int64_t>(parts.size()) == cut.count);
  for (std::size_t a = 0; a < 3; ++a) {
    std::vector<std::vector<float>> joined;
    for (const auto& [index, arrays] : parts) joined.push_back(arrays[a]);
    whole.arrays[a] = exec::reshard(joined, cut, whole.global_shape, exec::TensorCut{});
  }
  return whole;
}

// The newest checkpoint in `directory` loaded by the one rank of a tp 1 layout: every parameter's
// value and moments, by name.
std::map<std::string, WholeArrays> loaded_at_one_rank(const megaplan::ModelSpec& model, const ParallelPlan& plan,
                                                      const std::string& directory) {
  exec::CpuBackend backend;
  exec::StageChunk chunk(model, plan, 0, backend, {1234});
  const exec::ParallelGroups groups;
  exec::Optimizer optimizer({&chunk}, exec::OptimizerGroups{}, false, exec::OptimizerSettings{}, backend);
  REQUIRE(exec::load_checkpoint(directory, {model, plan, groups, {&chunk}, optimizer, backend}));
  std::map<std::string, WholeArrays> loaded;
  for (megaplan::test::ParameterState& state : megaplan::test::parameter_states(optimizer, backend)) {
    loaded[state.parameter->name] = {state.parameter->global_shape, std::move(state.arrays)};
  }
  return loaded;
}

// The first `rows` rows of row-major `values` of `columns` columns.
std::vector<float> first_rows(const std::vector<float>& values, int64_t rows, int64_t columns) {
  return {values.begin(), values.begin() + rows * columns};
}

}  // namespace

TEST_CASE("a checkpoint of tp 2 loads at tp 1 and tp 4, whose vocabulary padding differs", "[checkpoint]") {
  const megaplan::test::ScratchDirectory scratch;
  const megaplan::ModelSpec model = padded_gpt();
  const int64_t hidden = model.hidden_size, vocabulary = model.vocab_size;
  REQUIRE(megaplan::padded_vocab_size(model, 1) == 320);
  REQUIRE(megaplan::padded_vocab_size(model, 2) == 384);
  REQUIRE(megaplan::padded_vocab_size(model, 4) == 512);
  exec::TrainOptions options = checkpoint_training_options(megaplan::test::sentence_corpus(scratch));
  const auto tp = [](int64_t size) { return megaplan::test::layout(size, 1, 1, 1, ScheduleKind::kOneFOneB); };
  const Outcome whole = train(model, tp(2), options, scratch, "whole");
  REQUIRE(whole.losses.size() == 8);
  const std::string directory = scratch.file("checkpoints");
  options.save = directory;
  options.exit_interval = 4;
  (void)train(model, tp(2), options, scratch, "first-half");
  const std::string iteration = directory + "/iter_0000004";
  const WholeArrays embedding = saved_tensor(iteration, megaplan::kWordEmbeddings);
  REQUIRE(embedding.global_shape == std::vector<int64_t>{384, hidden});  // tp 2's padding, as trained

  // At tp 1 every real row, its moments and every other tensor are the saved ones; of the
  // padding, the 63 rows tp 1 keeps too.
  const std::map<std::string, WholeArrays> one = loaded_at_one_rank(model, tp(1), directory);
  for (const auto& [name, loaded] : one) {
    INFO(name);
    const WholeArrays saved = saved_tensor(iteration, name);
    for (std::size_t a = 0; a < 3; ++a) {
      INFO("array " << a);
      if (name != megaplan::kWordEmbeddings) {
        CHECK(loaded.arrays[a] == saved.arrays[a]);
        continue;
      }
      CHECK(loaded.global_shape == std::vector<int64_t>{320, hidden});
      CHECK(first_rows(loaded.arrays[a], vocabulary, hidden) == first_rows(saved.arrays[a], vocabulary, hidden));
      CHECK(loaded.arrays[a] == first_rows(saved.arrays[a], 320, hidden));
    }
  }

  // Both layouts train on from iteration 5, and at tp 4 the weights are the saved ones, the 128
  // padding rows tp 2 did not have zero. Where the padding is the same, the resume is exact.
  options.exit_interval = 0;
  options.save.reset();
  options.load = directory;
  options.keep_final_weights = true;
  exec::TrainOptions loaded_only = options;
  loaded_only.train_iters = 4;  // load, train nothing, keep the weights
  const Outcome four = train(model, tp(4), loaded_only, scratch, "tp4-loaded");
  CHECK(four.out.find("loaded " + directory + " at iteration 4") != std::string::npos);
  for (const auto& [name, value] : four.summary.final_weights) {
    INFO(name);
    const WholeArrays saved = saved_tensor(iteration, name);
    if (name != megaplan::kWordEmbeddings) {
      CHECK(value == saved.arrays[0]);
      continue;
    }
    REQUIRE(value.size() == static_cast<std::size_t>(512 * hidden));
    CHECK(first_rows(value, 384, hidden) == saved.arrays[0]);
    CHECK(std::vector<float>(value.begin() + 384 * hidden, value.end()) == std::vector<float>(128 * hidden, 0.0f));
  }
  options.keep_final_weights = false;
  std::map<int64_t, Outcome> resumed;
  for (const int64_t size : {1, 2, 4}) {
    INFO("tp " << size);
    resumed[size] = train(model, tp(size), options, scratch, "tp" + std::to_string(size));
    CHECK(resumed[size].summary.first_iteration == 5);
    REQUIRE(resumed[size].losses.size() == 4);
  }
  for (std::size_t i = 0; i < 4; ++i) CHECK(resumed[2].losses[i] == whole.losses[i + 4]);
  // The padded logits take part in the softmax (checkpoint.h): iteration 5's loss, at the loaded
  // weights, is lower over tp 1's 63 padding columns than over tp 2's 127, higher with tp 4's 255
  // (its 128 zero rows add logits of 0).
  CHECK(resumed[1].losses[0] < whole.losses[4]);
  CHECK(resumed[4].losses[0] > whole.losses[4]);

  // A model of another vocabulary is another model, whatever its padding.
  megaplan::ModelSpec other = model;
  other.vocab_size = 300;
  const std::string message = load_error([&] { (void)train(other, tp(1), options, scratch, "other-vocabulary"); });
  CHECK(message == "--load: " + iteration + "/state.json: the checkpoint's vocabulary is 257 tokens, the model's 300 " +
                       "(a checkpoint of another vocabulary: --vocab-size 257 trains on it)");
}

TEST_CASE("checkpoints record the tokenizer a run names, carry it over a resume, and read older ones", "[checkpoint]") {
  const megaplan::test::ScratchDirectory scratch;
  const megaplan::ModelSpec model = four_layer_gpt();
  const ParallelPlan plan = plan_of(1, 1, 1, ScheduleKind::kOneFOneB, false);
  exec::TrainOptions options = checkpoint_training_options(megaplan::test::sentence_corpus(scratch));
  options.train_iters = 2;
  options.save = scratch.file("checkpoints");
  options.tokenizer = exec::TokenizerOptions{};
  options.tokenizer->kind = "gpt2";
  options.tokenizer->vocab_file = "relative/vocab.json";  // recorded as given, made absolute
  options.tokenizer->merge_file = scratch.file("merges.txt");
  (void)train(model, plan, options, scratch, "named");
  const auto state_of = [&](const std::string& iteration) {
    return nlohmann::json::parse(megaplan::read_file_contents(*options.save + "/" + iteration + "/state.json"));
  };
  const nlohmann::json expected = {{"kind", "gpt2"},
                                   {"vocab_file", (fs::current_path() / "relative/vocab.json").string()},
                                   {"merge_file", scratch.file("merges.txt")}};
  CHECK(state_of("iter_0000002").at("tokenizer") == expected);
  // A resumed run that names none keeps it; convert reads it.
  options.load = options.save;
  options.tokenizer.reset();
  options.train_iters = 3;
  (void)train(model, plan, options, scratch, "resumed");
  CHECK(state_of("iter_0000003").at("tokenizer") == expected);
  const exec::CheckpointWeights weights = exec::read_checkpoint_weights(*options.save);
  REQUIRE(weights.tokenizer);
  CHECK(weights.tokenizer->kind == "gpt2");
  CHECK(weights.tokenizer->vocab_file == expected.at("vocab_file"));
  // A checkpoint saved before the field (no tokenizer, no checksum) loads, its tokenizer unknown.
  nlohmann::json older = state_of("iter_0000003");
  older.erase("tokenizer");
  older.erase("fnv1a64");
  write_text(*options.save + "/iter_0000003/state.json", older.dump(2));
  CHECK_FALSE(exec::read_checkpoint_weights(*options.save).tokenizer);
  options.train_iters = 4;
  CHECK(train(model, plan, options, scratch, "older").summary.first_iteration == 4);
  CHECK_FALSE(state_of("iter_0000004").contains("tokenizer"));
  // A damaged tokenizer field is refused naming it.
  nlohmann::json damaged = state_of("iter_0000004");
  damaged.erase("fnv1a64");
  damaged["tokenizer"] = {{"kind", "gpt2"}, {"vocab_fle", "x"}};
  write_text(*options.save + "/iter_0000004/state.json", damaged.dump(2));
  options.train_iters = 5;
  CHECK(refusal_of([&] {
          (void)train(model, plan, options, scratch, "damaged");
        }).find("state.json: tokenizer: vocab_fle") != std::string::npos);
}
