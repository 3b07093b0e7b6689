// Checkpoints at disk speed (issue 38): a save or load on several threads writes and reads what
// one thread does, bit for bit; a run saving with --async-save resumes as the uninterrupted run; a
// tensor of several checksum blocks round-trips and damage to any block is found; a checkpoint of
// format 2 (FNV-1a 64 checksums, tests/data/fnv1a_checkpoint) still loads and resumes.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/parameter_list.h"
#include "core/text_file.h"
#include "executor/model/tensor_shards.h"
#include "executor/runtime/cpu_backend.h"
#include "executor/train/checkpoint.h"
#include "executor/train/checkpoint_format.h"
#include "executor/train/trainer.h"
#include "tests/executor/train/checkpoint_fixtures.h"
#include "tests/executor/train/training_fixtures.h"
#include "tests/executor/train/training_run.h"

namespace {

using megaplan::ParallelPlan;
using megaplan::ScheduleKind;
using megaplan::test::checkpoint_training_options;
using megaplan::test::files_under;
using megaplan::test::load_error;
using megaplan::test::Outcome;
namespace exec = megaplan::exec;
namespace fs = std::filesystem;

Outcome train(const megaplan::ModelSpec& model, const ParallelPlan& plan, const exec::TrainOptions& options,
              const megaplan::test::ScratchDirectory& scratch, const std::string& name) {
  return megaplan::test::train_logged(
      model, plan, options, scratch, name,
      [](int64_t) -> std::unique_ptr<exec::Backend> { return std::make_unique<exec::CpuBackend>(); });
}

using megaplan::test::flip_byte;

}  // namespace

TEST_CASE("a save and a load on several threads equal one thread's, bit for bit", "[checkpoint]") {
  const megaplan::test::ScratchDirectory scratch;
  const megaplan::ModelSpec model = megaplan::test::four_layer_gpt();
  const ParallelPlan plan = megaplan::test::layout(1, 2, 1, 1, ScheduleKind::kOneFOneB);
  exec::TrainOptions options = checkpoint_training_options(megaplan::test::sentence_corpus(scratch));
  options.train_iters = 4;
  options.keep_final_weights = true;
  for (const int64_t threads : {1, 4}) {
    options.checkpoint_threads = threads;
    options.save = scratch.file("threads-" + std::to_string(threads));
    (void)train(model, plan, options, scratch, "save-" + std::to_string(threads));
  }
  CHECK(files_under(scratch.file("threads-1")) == files_under(scratch.file("threads-4")));

  options.save.reset();
  options.load = scratch.file("threads-4");
  options.train_iters = 6;
  std::map<int64_t, Outcome> resumed;
  for (const int64_t threads : {1, 4}) {
    options.checkpoint_threads = threads;
    resumed[threads] = train(model, plan, options, scratch, "load-" + std::to_string(threads));
  }
  CHECK(resumed[1].summary.first_iteration == 5);
  CHECK(resumed[1].losses == resumed[4].losses);
  CHECK(resumed[1].summary.final_weights == resumed[4].summary.final_weights);
}

TEST_CASE("a run saving with --async-save publishes each save later and resumes bit for bit", "[checkpoint]") {
  const megaplan::test::ScratchDirectory scratch;
  const megaplan::ModelSpec model = megaplan::test::four_layer_gpt();
  ParallelPlan plan = megaplan::test::layout(1, 2, 2, 1, ScheduleKind::kOneFOneB);
  plan.use_distributed_optimizer = true;  // the moments gathered on the training thread first
  exec::TrainOptions options = checkpoint_training_options(megaplan::test::sentence_corpus(scratch));
  const Outcome whole = train(model, plan, options, scratch, "whole");
  REQUIRE(whole.losses.size() == 8);

  const std::string directory = scratch.file("checkpoints");
  options.save = directory;
  options.async_save = true;
  options.save_interval = 2;
  options.exit_interval = 6;
  const Outcome first = train(model, plan, options, scratch, "first");
  CHECK(first.summary.last_iteration == 6);
  // Each save is published at the next one, the last at the run's end.
  const std::size_t started = first.out.find("saving " + directory + " at iteration 2 in the background");
  const std::size_t published = first.out.find("saved " + directory + " at iteration 2\n");
  CHECK(started != std::string::npos);
  CHECK(published != std::string::npos);
  CHECK(published > first.out.find("iteration 4/8"));
  CHECK(first.out.find("saved " + directory + " at iteration 6\n") != std::string::npos);
  CHECK(megaplan::read_file_contents(directory + "/latest_checkpointed_iteration.txt") == "6\n");
  CHECK_FALSE(fs::exists(directory + "/iter_0000006.tmp"));

  options.exit_interval = 0;
  options.load = directory;
  const Outcome second = train(model, plan, options, scratch, "second");
  CHECK(second.summary.first_iteration == 7);
  REQUIRE(second.losses.size() == 2);
  CHECK(second.losses[0] == whole.losses[6]);
  CHECK(second.losses[1] == whole.losses[7]);
  CHECK(megaplan::read_file_contents(directory + "/latest_checkpointed_iteration.txt") == "8\n");
}

TEST_CASE("a tensor of several checksum blocks round-trips, and damage to its last block is refused", "[checkpoint]") {
  const megaplan::test::ScratchDirectory scratch;
  megaplan::ModelSpec model = megaplan::test::four_layer_gpt();
  model.vocab_size = 40'000;  // a word embedding of 15 MB with its moments: four blocks of 4 MiB
  std::mt19937 generator(5);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::map<std::string, exec::WholeTensor> tensors;
  for (megaplan::ParameterSpec& spec : megaplan::describe_parameters(model, megaplan::ParallelPlan{}, 0)) {
    if (spec.name == megaplan::kOutputWeight) continue;  // tied: the word embedding's copy
    if (spec.name == megaplan::kWordEmbeddings) spec.global_shape[0] = model.vocab_size;
    exec::WholeTensor tensor{spec.global_shape, std::vector<float>(exec::elements(spec.global_shape))};
    for (float& value : tensor.values) value = normal(generator);
    tensors.emplace(spec.name, std::move(tensor));
  }
  const std::string directory = scratch.file("blocks");
  exec::write_checkpoint_weights(directory, model, megaplan::test::layout(1, 1, 1, 1, ScheduleKind::kOneFOneB), tensors,
                                 7);
  const exec::CheckpointWeights read = exec::read_checkpoint_weights(directory);
  REQUIRE(read.tensors.size() == tensors.size());
  for (const auto& [name, tensor] : tensors) {
    INFO(name);
    CHECK(read.tensors.at(name).shape == tensor.shape);
    CHECK(read.tensors.at(name).values == tensor.values);
  }

  const std::string rank = directory + "/iter_0000000/mp_rank_00";
  const nlohmann::json manifest = nlohmann::json::parse(megaplan::read_file_contents(rank + "/manifest.json"));
  CHECK(manifest.at("format") == "megaplan-checkpoint/4");
  CHECK(manifest.at("tensor_checksum") == "xxh3_64");
  const uint64_t block = manifest.at("checksum_block_bytes").get<uint64_t>();
  uint64_t offset = 0, bytes = 0;
  for (const nlohmann::json& tensor : manifest.at("tensors")) {
    if (tensor.at("name") == megaplan::kWordEmbeddings) {
      offset = tensor.at("offset").get<uint64_t>();
      bytes = 3 * sizeof(float) * exec::elements(tensor.at("shape").get<std::vector<int64_t>>());
    }
  }
  REQUIRE(bytes > 3 * block);
  flip_byte(rank + "/model.bin", offset + bytes - 7);  // the last, shorter block
  const std::string message = load_error([&] { (void)exec::read_checkpoint_weights(directory); });
  CHECK(message == "--load: " + rank + "/model.bin: checksum of " + megaplan::kWordEmbeddings +
                       " does not match its manifest (XXH3-64 " + message.substr(message.find("XXH3-64 ") + 8, 16) +
                       " read, " + message.substr(message.find(" read, ") + 7, 16) + " saved): the file is corrupted");
}

TEST_CASE("a checkpoint of format 2, checksummed with FNV-1a 64, loads and resumes", "[checkpoint]") {
  const megaplan::test::ScratchDirectory scratch;
  const std::string fixture = std::string(MEGAPLAN_TEST_DATA_DIR) + "/fnv1a_checkpoint";
  const exec::CheckpointWeights weights = exec::read_checkpoint_weights(fixture);
  CHECK(weights.model.name == "micro-gpt");
  CHECK(weights.tensors.count(megaplan::kWordEmbeddings) == 1);

  // Resumed at iteration 3 (and saved again in the current format).
  const std::string directory = scratch.file("resumed");
  fs::copy(fixture, directory, fs::copy_options::recursive);
  exec::TrainOptions options = checkpoint_training_options(megaplan::test::sentence_corpus(scratch));
  options.train_iters = 3;
  options.load = directory;
  options.save = directory;
  ParallelPlan plan = megaplan::test::layout(1, 1, 1, 1, ScheduleKind::kOneFOneB, 1, 2);
  const Outcome resumed = train(weights.model, plan, options, scratch, "resumed");
  CHECK(resumed.summary.first_iteration == 3);
  CHECK(megaplan::read_file_contents(directory + "/latest_checkpointed_iteration.txt") == "3\n");

  // A flipped byte in the old format is refused, naming its checksum.
  const std::string damaged = scratch.file("damaged");
  fs::copy(fixture, damaged, fs::copy_options::recursive);
  flip_byte(damaged + "/iter_0000002/mp_rank_00/model.bin", 1001);
  const std::string message = load_error([&] { (void)exec::read_checkpoint_weights(damaged); });
  CHECK(message.find("does not match its manifest (FNV-1a 64 ") != std::string::npos);
}

TEST_CASE("a checkpoint of format 3, its manifests bound to nothing, loads and resumes", "[checkpoint]") {
  const megaplan::test::ScratchDirectory scratch;
  const megaplan::ModelSpec model = megaplan::test::four_layer_gpt();
  exec::TrainOptions options = checkpoint_training_options(megaplan::test::sentence_corpus(scratch));
  options.train_iters = 2;
  options.save = scratch.file("saved");
  options.exit_interval = 1;
  const ParallelPlan tp2 = megaplan::test::layout(2, 1, 1, 1, ScheduleKind::kOneFOneB);
  (void)train(model, tp2, options, scratch, "saved");
  // Rewritten as format 3 wrote it: no binding, the files' own checksums recomputed.
  const std::string iteration = *options.save + "/iter_0000001";
  for (const std::string file : {"/state.json", "/mp_rank_00/manifest.json", "/mp_rank_01/manifest.json"}) {
    nlohmann::json json = nlohmann::json::parse(megaplan::read_file_contents(iteration + file));
    json["format"] = "megaplan-checkpoint/3";
    for (const char* key : {"iteration", "directory", "plan", "fnv1a64"}) {
      if (file != "/state.json" || std::string(key) == "fnv1a64") json.erase(key);
    }
    json["fnv1a64"] = exec::checkpoint_format::json_checksum(json);
    std::ofstream(iteration + file) << json.dump(1) << "\n";
  }
  options.exit_interval = 0;
  options.load = options.save;
  const Outcome resumed = train(model, tp2, options, scratch, "resumed");
  CHECK(resumed.summary.first_iteration == 2);
}
