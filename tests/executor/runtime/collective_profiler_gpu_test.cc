// The collective profiler on the GPU: two ranks as threads sharing GPU 0 (the in-process one-GPU
// communicator), each with a CUDA backend, time collectives between marks on their compute
// streams and compute with collectives on streams beside it. What NCCL over several GPUs measures
// comes from the same code (measure_collectives_on_gpus); this checks the timing on real streams.
#include <catch2/catch.hpp>

#include <chrono>
#include <vector>

#include "executor/comm/in_process_comm.h"
#include "executor/comm/in_process_gpu_memory.h"
#include "executor/comm/rank_threads.h"
#include "executor/runtime/collective_profiler.h"
#include "executor/runtime/cuda_backend.h"
#include "executor/runtime/kernel_profiler.h"

namespace exec = megaplan::exec;

TEST_CASE("collectives and compute beside them are timed on the GPU's streams", "[gpu][timing]") {
  exec::CollectiveGrid grid;
  grid.group_sizes = {2};
  // 8192x apart: the in-process all-to-all's fixed cost (a staged message per pair, about 0.2 ms for
  // two ranks on an H200) hides 1024x (64 KiB and 64 MiB timed alike).
  grid.bytes = {int64_t{1} << 16, int64_t{1} << 29};
  grid.compute = exec::layer_kernels(1024, 2048);
  grid.overlap_bytes = int64_t{1} << 24;
  exec::InProcessWorld world(2, std::chrono::minutes(2), exec::make_in_process_gpu_memory());
  megaplan::CommTimings timings;
  exec::run_rank_threads(world, 2, [&](int64_t rank) {
    const std::unique_ptr<exec::Backend> backend = exec::make_cuda_backend();
    const exec::GroupMaker make_group = [&](const std::vector<int64_t>& ranks, const std::string& label) {
      return world.group(rank, ranks, label, [&backend] { return backend->compute_stream(); });
    };
    megaplan::CommTimings mine = exec::measure_collectives(*backend, rank, 2, make_group, grid, {});
    if (rank == 0) timings = std::move(mine);
  });
  REQUIRE(timings.collectives.size() == 8);  // all-reduce, all-gather, reduce-scatter, all-to-all
  for (std::size_t i = 0; i < timings.collectives.size(); i += 2) {
    INFO(megaplan::to_string(timings.collectives[i].op));
    CHECK(timings.collectives[i].seconds > 0);
    CHECK(timings.collectives[i + 1].seconds > timings.collectives[i].seconds);  // 8192x the bytes
  }
  REQUIRE(timings.p2p.size() == 2);
  CHECK(timings.p2p[1].seconds > timings.p2p[0].seconds);
  REQUIRE(timings.overlap.size() == 5);
  for (const megaplan::OverlapTiming& beside : timings.overlap) {
    INFO(megaplan::to_string(beside.op) << ": compute alone " << beside.compute_alone_s << " s, beside "
                                        << beside.compute_beside_s << " s; collective alone "
                                        << beside.collective_alone_s << " s, beside " << beside.collective_beside_s
                                        << " s");
    // A layer of width 1024 over 2048 tokens. Both ranks run their passes on the one GPU, alone
    // and beside alike, so the times say nothing of a slowdown here: each only has to be a pass's
    // or a call's time, not an event's or a whole run's.
    CHECK(beside.compute_alone_s > 1e-5);
    CHECK(beside.compute_beside_s > 0.25 * beside.compute_alone_s);
    CHECK(beside.compute_beside_s < 10 * beside.compute_alone_s);
    CHECK(beside.collective_alone_s > 1e-6);
    CHECK(beside.collective_beside_s > 0.25 * beside.collective_alone_s);
    CHECK(beside.collective_beside_s < 100 * beside.collective_alone_s);
  }
}
