// Checkpoints through a window (issue 38): a synchronous save streams the device through a few
// blocks per thread instead of holding an image of the rank's directory, and writes the bytes
// --async-save writes from its image; a load under the saving layout streams every tensor back bit
// for bit; --async-save is refused when its image cannot fit in the host's memory.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "executor/model/stage_chunk.h"
#include "executor/runtime/cpu_backend.h"
#include "executor/train/checkpoint.h"
#include "executor/train/optimizer.h"
#include "executor/train/parallel_groups.h"
#include "tests/executor/train/checkpoint_fixtures.h"
#include "tests/executor/train/training_fixtures.h"

namespace {

namespace exec = megaplan::exec;
using megaplan::ModelSpec;
using megaplan::ParallelPlan;

constexpr uint64_t kBlockBytes = uint64_t{4} << 20;  // the checksum blocks a window holds

// One rank's chunk and optimizer on the CPU, the moments set to draws of `seed` (a fresh
// optimizer's are zero, which would hide a moment read from the wrong place).
struct OneRank {
  OneRank(const ModelSpec& model_in, const ParallelPlan& plan_in, uint64_t seed)
      : model(model_in),
        plan(plan_in),
        chunk(model, plan, 0, backend, {seed}),
        optimizer({&chunk}, exec::OptimizerGroups{}, false, exec::OptimizerSettings{}, backend) {
    std::mt19937 generator(static_cast<unsigned>(seed));
    std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
    for (const exec::Parameter& parameter : chunk.parameters()) {
      for (const bool second : {false, true}) {
        std::vector<float> moment(parameter.size);
        for (float& value : moment) value = uniform(generator);
        optimizer.import_moment(parameter, second, 0, moment.data(), moment.size());
      }
    }
  }
  exec::CheckpointRank rank(int64_t threads) { return {model, plan, groups, {&chunk}, optimizer, backend, threads}; }
  // Every parameter's value and moments, in order.
  std::vector<std::array<std::vector<float>, 3>> state() {
    std::vector<std::array<std::vector<float>, 3>> arrays;
    for (megaplan::test::ParameterState& parameter : megaplan::test::parameter_states(optimizer, backend)) {
      arrays.push_back(std::move(parameter.arrays));
    }
    return arrays;
  }

  const ModelSpec& model;
  const ParallelPlan& plan;
  exec::CpuBackend backend;
  exec::StageChunk chunk;
  const exec::ParallelGroups groups;
  exec::Optimizer optimizer;
};

// four_layer_gpt with a word embedding of 200,000 rows: 77 MB with its moments, more than the
// eight blocks (32 MiB) a window of one thread holds.
ModelSpec large_vocabulary_gpt() {
  ModelSpec model = megaplan::test::four_layer_gpt();
  model.vocab_size = 200'000;
  return model;
}

}  // namespace

TEST_CASE("a synchronous save streams through a window and writes what --async-save writes", "[checkpoint]") {
  const megaplan::test::ScratchDirectory scratch;
  const ModelSpec model = large_vocabulary_gpt();
  const ParallelPlan plan = megaplan::test::layout(1, 1, 1, 1, megaplan::ScheduleKind::kOneFOneB);
  OneRank saving(model, plan, 7);
  exec::TrainingState state;
  state.iteration = 3;
  state.consumed_samples = 24;

  exec::CheckpointSaver synchronous(false, saving.backend);
  synchronous.save(scratch.file("sync"), state, saving.rank(1));
  const uint64_t image_bytes = std::filesystem::file_size(scratch.file("sync/iter_0000003/mp_rank_00/model.bin"));
  CHECK(image_bytes == exec::async_save_image_bytes(model, plan, saving.groups));
  CHECK(synchronous.host_bytes() == 8 * kBlockBytes);  // one thread's window, not the image
  CHECK(synchronous.host_bytes() < image_bytes);
  CHECK(synchronous.last_save().bytes == image_bytes);

  exec::CheckpointSaver background(true, saving.backend);
  background.save(scratch.file("async"), state, saving.rank(3));
  CHECK(background.finish(saving.rank(3)) == 3);
  CHECK(background.host_bytes() >= image_bytes);  // the whole image, written behind the training
  CHECK(megaplan::test::files_under(scratch.file("sync")) == megaplan::test::files_under(scratch.file("async")));

  // Under the saving layout every tensor streams back as saved, on any number of threads.
  for (const int64_t threads : {1, 3}) {
    INFO(threads << " threads");
    OneRank loading(model, plan, 8);
    REQUIRE(loading.state() != saving.state());
    exec::CheckpointLoadCounts counts;
    REQUIRE(exec::load_checkpoint(scratch.file("sync"), loading.rank(threads), &counts));
    CHECK(counts.tensors_as_saved == static_cast<int64_t>(loading.chunk.parameters().size()));
    CHECK(counts.tensors_resharded == 0);
    CHECK(counts.bytes == image_bytes);
    CHECK(loading.state() == saving.state());
  }
}

TEST_CASE("--async-save is refused when its image cannot fit in the host's available memory", "[checkpoint]") {
  constexpr uint64_t kGiB = uint64_t{1} << 30;
  CHECK_NOTHROW(exec::check_async_save_memory(3 * kGiB, 4 * kGiB));
  CHECK_NOTHROW(exec::check_async_save_memory(0, 0));  // a rank that writes nothing
  try {
    exec::check_async_save_memory(3 * kGiB + 1, 4 * kGiB);
    FAIL("no SpecError");
  } catch (const megaplan::SpecError& error) {
    CHECK(error.field() == "--async-save");
    const std::string message = error.what();
    CHECK(message.find("3.00 GiB") != std::string::npos);
    CHECK(message.find("4.00 GiB") != std::string::npos);
    CHECK(message.find("without --async-save") != std::string::npos);
  }
}
