// Checkpoint save and load speed without training (issue 38): one CPU rank of a model preset (its
// parameters drawn, its moments zero: the bytes do not change the speed) saved synchronously, then
// with --async-save (the pause and the write behind it), and loaded, for each thread count; prints
// GB/s per step. The page cache is dropped before each load where this user may (root outside a
// container), so that the load reads the disk; the table says which.
//   megaplan_checkpoint_bench DIR MODEL LAYERS [THREADS ...]
// e.g. megaplan_checkpoint_bench /tmp/ckpt-bench gpt2-350m 12 1 2 (a 1.83 GB checkpoint).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/model_presets.h"
#include "core/parallel_plan.h"
#include "executor/model/stage_chunk.h"
#include "executor/runtime/cpu_backend.h"
#include "executor/train/checkpoint.h"
#include "executor/train/optimizer.h"
#include "executor/train/parallel_groups.h"

namespace {

namespace exec = megaplan::exec;

double seconds_of(const std::function<void()>& step) {
  const auto start = std::chrono::steady_clock::now();
  step();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// "cold" when the page cache could be dropped, "warm" when this user may not.
const char* drop_page_cache() {
  ::sync();
  std::ofstream drop("/proc/sys/vm/drop_caches");
  drop << "3\n";
  drop.flush();
  return drop ? "cold" : "warm";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s DIR MODEL LAYERS [THREADS ...]\n", argv[0]);
    return 2;
  }
  const std::string directory = argv[1];
  megaplan::ModelSpec model = megaplan::model_preset(argv[2]);
  model.num_layers = std::atoll(argv[3]);
  std::vector<int64_t> thread_counts;
  for (int a = 4; a < argc; ++a) thread_counts.push_back(std::atoll(argv[a]));
  if (thread_counts.empty()) thread_counts = {1, 2};

  megaplan::ParallelPlan plan;
  exec::CpuBackend backend;
  exec::StageChunk chunk(model, plan, 0, backend, {1234});
  const exec::ParallelGroups groups;
  exec::Optimizer optimizer({&chunk}, exec::OptimizerGroups{}, false, exec::OptimizerSettings{}, backend);
  exec::TrainingState state;
  state.iteration = 1;

  std::printf("%-8s%7s | %9s%7s | %9s%7s%9s | %7s%7s cache\n", "threads", "GB", "sync s", "GB/s", "async s", "GB/s",
              "pause s", "load s", "GB/s");
  for (const int64_t threads : thread_counts) {
    const exec::CheckpointRank rank{model, plan, groups, {&chunk}, optimizer, backend, threads};
    std::filesystem::remove_all(directory);
    exec::CheckpointSaver synchronous(false, backend);
    synchronous.save(directory, state, rank);  // the first save faults in what the saver keeps
    const double sync_s = seconds_of([&] { synchronous.save(directory, state, rank); });
    exec::CheckpointSaver background(true, backend);
    background.save(directory, state, rank);
    (void)background.finish(rank);
    background.save(directory, state, rank);
    (void)background.finish(rank);
    const double pause_s = background.last_save().snapshot_seconds;
    const double async_s = background.last_save().write_seconds;
    const double gigabytes = static_cast<double>(background.last_save().bytes) / 1e9;
    const char* cache = drop_page_cache();
    const double load_s = seconds_of([&] { (void)exec::load_checkpoint(directory, rank); });
    std::printf("%-8lld%7.2f | %9.2f%7.2f | %9.2f%7.2f%9.2f | %7.2f%7.2f %s\n", static_cast<long long>(threads),
                gigabytes, sync_s, gigabytes / sync_s, async_s, gigabytes / async_s, pause_s, load_s,
                gigabytes / load_s, cache);
    std::fflush(stdout);
  }
  std::filesystem::remove_all(directory);
  return 0;
}
