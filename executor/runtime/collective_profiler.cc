#include "executor/runtime/collective_profiler.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <exception>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "executor/comm/nccl_comm.h"
#include "executor/runtime/cuda_backend.h"
#include "executor/runtime/kernel_launch.h"
#include "executor/runtime/kernel_profiler.h"
#include "executor/runtime/median.h"

namespace megaplan::exec {

namespace {

// The collectives beside compute run at least this much longer than the passes would alone, so
// that compute slowed by up to half still has them beside it the whole time.
constexpr double kCoverage = 1.5;
// The other way round, the passes run at least this much longer than the collectives would alone,
// so that collectives stretched up to that far still have compute beside them the whole time (the
// median of their calls is still right when only the first half of them have it).
constexpr double kCollectiveCoverage = 3;
// Buffers of bf16 elements in the backend's fp32 allocations (two elements to a float).
class CommBuffers {
 public:
  CommBuffers(Backend& backend, int64_t bytes) : backend_(backend) {
    const auto floats = static_cast<std::size_t>((bytes + 3) / 4);
    input_ = backend.allocate(floats);
    output_ = backend.allocate(floats);
    scratch_ = backend.allocate(1);
  }
  ~CommBuffers() {
    backend_.release(input_);
    backend_.release(output_);
    backend_.release(scratch_);
  }
  CommBuffers(const CommBuffers&) = delete;
  CommBuffers& operator=(const CommBuffers&) = delete;

  // One call of `op` over `bytes` (the whole buffer, as nccl-tests counts it).
  Request call(Comm& group, CollectiveOp op, int64_t bytes) {
    const auto elements = static_cast<std::size_t>(bytes / 2);
    const auto share = elements / static_cast<std::size_t>(group.size());
    switch (op) {
      case CollectiveOp::kAllReduce: return group.all_reduce(input_, elements, DType::kBFloat16, ReduceOp::kSum);
      case CollectiveOp::kAllGather: return group.all_gather(input_, output_, share, DType::kBFloat16);
      case CollectiveOp::kReduceScatter:
        return group.reduce_scatter(input_, output_, share, DType::kBFloat16, ReduceOp::kSum);
      case CollectiveOp::kSendRecv:
        return group.rank() == 0 ? group.send(input_, elements, DType::kBFloat16, 1)
                                 : group.recv(output_, elements, DType::kBFloat16, 0);
      case CollectiveOp::kAllToAll: {  // an equal share to each member, as nccl-tests' alltoall_perf
        const std::vector<std::size_t> counts(static_cast<std::size_t>(group.size()), share);
        return group.all_to_all(input_, counts, output_, counts, DType::kBFloat16);
      }
    }
    throw std::logic_error("CommBuffers::call: " + to_string(op) + " is not timed");
  }

  // The largest `value` any member of `group` passes, on every member.
  int64_t agreed_max(Comm& group, int64_t value) {
    const auto mine = static_cast<float>(value);
    backend_.upload(scratch_, &mine, 1);
    group.all_reduce(scratch_, 1, DType::kFloat32, ReduceOp::kMax)->wait();
    float agreed = 0;
    backend_.download(&agreed, scratch_, 1);
    return static_cast<int64_t>(agreed);
  }

 private:
  Backend& backend_;
  float* input_;
  float* output_;
  float* scratch_;
};

int repetitions_for(const CollectiveGrid& grid, double first) {
  return std::clamp(static_cast<int>(std::ceil(grid.target_seconds / std::max(first, 1e-9))), grid.min_repetitions,
                    grid.max_repetitions);
}

// The median time of one call and its wait, back to back; the group agrees on the repetitions.
double time_calls(Backend& backend, Comm& group, CommBuffers& buffers, const CollectiveGrid& grid, CollectiveOp op,
                  int64_t bytes) {
  buffers.call(group, op, bytes)->wait();  // NCCL connects a pair's channels at their first use
  const TimingMark before = backend.mark();
  buffers.call(group, op, bytes)->wait();
  const double first = backend.seconds_between(before, backend.mark());
  backend.release_marks();
  const int64_t repetitions = buffers.agreed_max(group, repetitions_for(grid, first));
  std::vector<TimingMark> marks;
  marks.push_back(backend.mark());
  for (int64_t r = 0; r < repetitions; ++r) {
    buffers.call(group, op, bytes)->wait();
    marks.push_back(backend.mark());
  }
  std::vector<double> seconds;
  for (std::size_t i = 1; i < marks.size(); ++i) seconds.push_back(backend.seconds_between(marks[i - 1], marks[i]));
  backend.release_marks();
  return median_of(seconds);
}

// The grid's compute, a pass at a time, each kernel on buffers of its own.
class ComputePasses {
 public:
  ComputePasses(Backend& backend, const std::vector<Kernel>& kernels) : backend_(backend) {
    for (const Kernel& kernel : kernels) launches_.push_back(std::make_unique<KernelLaunch>(backend, kernel));
  }
  void pass() {
    for (const auto& launch : launches_) (*launch)();
  }
  // Seconds per pass over `passes` passes queued back to back.
  double time(int64_t passes) {
    const TimingMark before = backend_.mark();
    for (int64_t p = 0; p < passes; ++p) pass();
    const double seconds = backend_.seconds_between(before, backend_.mark()) / static_cast<double>(passes);
    backend_.release_marks();
    return seconds;
  }

 private:
  Backend& backend_;
  std::vector<std::unique_ptr<KernelLaunch>> launches_;
};

// Both sides of `op` on `group` beside the grid's compute: the compute's passes beside back-to-back
// collectives, and the collectives' calls beside back-to-back passes.
OverlapTiming time_beside(Backend& backend, Comm& group, CommBuffers& buffers, ComputePasses& compute,
                          const CollectiveGrid& grid, CollectiveOp op) {
  compute.pass();  // cuBLASLt picks its algorithms
  const double first = compute.time(1);
  const int64_t passes = buffers.agreed_max(group, repetitions_for(grid, first));
  const double alone = compute.time(passes);
  const double call = time_calls(backend, group, buffers, grid, op, grid.overlap_bytes);
  const auto wanted = static_cast<int64_t>(std::ceil(kCoverage * static_cast<double>(passes) * alone / call)) + 1;
  const int64_t calls = buffers.agreed_max(group, wanted);
  // Issued before the passes, the collectives wait only for what ran before; the passes then run
  // beside them on the compute stream.
  std::vector<Request> requests;
  for (int64_t c = 0; c < calls; ++c) requests.push_back(buffers.call(group, op, grid.overlap_bytes));
  const double beside = compute.time(passes);
  for (const Request& request : requests) request->wait();
  backend.synchronize();

  // The collectives' side: calls one after another on the first stream of a pair, a mark after
  // each, while the passes run on the second from the same start (Backend::run_pair).
  const int64_t timed_calls = buffers.agreed_max(group, repetitions_for(grid, call));
  const auto cover =
      static_cast<int64_t>(std::ceil(kCollectiveCoverage * static_cast<double>(timed_calls) * call / alone)) + 1;
  const int64_t cover_passes = buffers.agreed_max(group, cover);
  std::vector<TimingMark> marks;
  backend.run_pair(
      [&] {
        marks.push_back(backend.mark());
        for (int64_t c = 0; c < timed_calls; ++c) {
          buffers.call(group, op, grid.overlap_bytes)->wait();
          marks.push_back(backend.mark());
        }
      },
      [&] {
        for (int64_t p = 0; p < cover_passes; ++p) compute.pass();
      });
  std::vector<double> seconds;
  for (std::size_t i = 1; i < marks.size(); ++i) seconds.push_back(backend.seconds_between(marks[i - 1], marks[i]));
  backend.synchronize();
  backend.release_marks();
  return {op, group.size(), alone, beside, call, median_of(seconds)};
}

std::vector<int64_t> first_ranks(int64_t count) {
  std::vector<int64_t> ranks(static_cast<std::size_t>(count));
  for (int64_t r = 0; r < count; ++r) ranks[static_cast<std::size_t>(r)] = r;
  return ranks;
}

void check_grid(const CollectiveGrid& grid, int64_t world_size) {
  const auto fail = [](const std::string& why) { throw std::invalid_argument("measure_collectives: " + why); };
  if (grid.min_repetitions < 1 || grid.max_repetitions < grid.min_repetitions)
    fail("repetitions must satisfy 1 <= min <= max");
  if (grid.group_sizes.empty() || grid.bytes.empty() || grid.compute.empty()) fail("the grid is empty");
  const int64_t largest = *std::max_element(grid.group_sizes.begin(), grid.group_sizes.end());
  if (*std::min_element(grid.group_sizes.begin(), grid.group_sizes.end()) < 2 || largest > world_size) {
    fail("group sizes must lie in 2 .. " + std::to_string(world_size));
  }
  std::vector<int64_t> sizes = grid.bytes;
  sizes.push_back(grid.overlap_bytes);
  for (const int64_t bytes : sizes) {
    if (bytes <= 0 || bytes % (2 * largest) != 0) {
      fail(std::to_string(bytes) + " bytes is not a positive multiple of 2 x " + std::to_string(largest));
    }
  }
}

}  // namespace

CollectiveGrid collective_grid(bool quick, int64_t world_size) {
  if (world_size < 2) throw std::invalid_argument("collective_grid: needs two ranks or more");
  CollectiveGrid grid;
  for (int64_t g = 2; g <= world_size; g *= 2) grid.group_sizes.push_back(g);
  const int64_t smallest = int64_t{1} << (quick ? 20 : 16), largest = int64_t{1} << (quick ? 28 : 30);
  for (int64_t bytes = smallest; bytes <= largest; bytes *= quick ? 16 : 4) grid.bytes.push_back(bytes);
  grid.compute = layer_kernels(4096, 4096);
  grid.overlap_bytes = int64_t{1} << 28;
  return grid;
}

CommTimings measure_collectives(Backend& backend, int64_t rank, int64_t world_size, const GroupMaker& make_group,
                                const CollectiveGrid& grid,
                                const std::function<void(int64_t done, int64_t total)>& progress) {
  check_grid(grid, world_size);
  const int64_t sizes = static_cast<int64_t>(grid.bytes.size());
  const auto collectives = static_cast<int64_t>(kGroupCollectives.size());
  // Each collective at each size over each group, send/receive at each size, and compute beside
  // each collective and send/receive.
  const int64_t total = static_cast<int64_t>(grid.group_sizes.size()) * collectives * sizes + sizes + collectives + 1;
  int64_t done = 0;
  const auto step = [&] {
    if (progress) progress(++done, total);
  };
  const int64_t largest_bytes = std::max(*std::max_element(grid.bytes.begin(), grid.bytes.end()), grid.overlap_bytes);
  const int64_t largest_group = *std::max_element(grid.group_sizes.begin(), grid.group_sizes.end());
  CommTimings timings;
  const auto keep = [&](std::vector<CommTiming>& table, CollectiveOp op, int64_t group_size, int64_t bytes,
                        double seconds) {
    if (rank == 0) table.push_back({op, group_size, bytes, seconds});
  };
  for (const int64_t group_size : grid.group_sizes) {
    const std::unique_ptr<Comm> group = make_group(first_ranks(group_size), "profile-" + std::to_string(group_size));
    if (group) {
      CommBuffers buffers(backend, largest_bytes);
      for (const CollectiveOp op : kGroupCollectives) {
        for (const int64_t bytes : grid.bytes) {
          keep(timings.collectives, op, group_size, bytes, time_calls(backend, *group, buffers, grid, op, bytes));
          step();
        }
      }
      if (group_size == largest_group) {
        ComputePasses compute(backend, grid.compute);
        for (const CollectiveOp op : kGroupCollectives) {
          const OverlapTiming beside = time_beside(backend, *group, buffers, compute, grid, op);
          if (rank == 0) timings.overlap.push_back(beside);
          step();
        }
      }
    } else {
      done += collectives * sizes + (group_size == largest_group ? collectives : 0);
      if (progress) progress(done, total);
    }
  }
  const std::unique_ptr<Comm> pair = make_group(first_ranks(2), "profile-p2p");
  if (pair) {
    CommBuffers buffers(backend, largest_bytes);
    for (const int64_t bytes : grid.bytes) {
      keep(timings.p2p, CollectiveOp::kSendRecv, 2, bytes,
           time_calls(backend, *pair, buffers, grid, CollectiveOp::kSendRecv, bytes));
      step();
    }
    ComputePasses compute(backend, grid.compute);
    const OverlapTiming beside = time_beside(backend, *pair, buffers, compute, grid, CollectiveOp::kSendRecv);
    if (rank == 0) timings.overlap.push_back(beside);
    step();
  } else {
    done = total;
    if (progress) progress(done, total);
  }
  return timings;
}

CommTimings measure_collectives_on_gpus(int64_t gpus, const CollectiveGrid& grid,
                                        const std::function<void(int64_t done, int64_t total)>& progress) {
  // Rank 0's NCCL id reaches the others through a future; a rank 0 that fails before it has one
  // hands them its exception instead, so that none waits for ever.
  std::promise<std::vector<uint8_t>> id;
  const std::shared_future<std::vector<uint8_t>> shared_id = id.get_future().share();
  std::mutex failure_mutex;
  std::exception_ptr failure;
  CommTimings timings;
  const auto body = [&](int64_t rank) {
    std::unique_ptr<NcclWorld> world;
    try {
      const IdBroadcast broadcast = [&](const std::vector<uint8_t>& blob) {
        if (rank == 0) id.set_value(blob);
        return shared_id.get();
      };
      world = make_nccl_world(rank, gpus, static_cast<int>(rank), broadcast, std::chrono::minutes(5));
      const std::unique_ptr<Backend> backend = make_cuda_backend();  // on the GPU the world selected
      const GroupMaker make_group = [&](const std::vector<int64_t>& ranks, const std::string& label) {
        const auto position = std::find(ranks.begin(), ranks.end(), rank);
        const bool member = position != ranks.end();
        return world->split(member ? 0 : -1, member ? position - ranks.begin() : 0, ranks, label,
                            [&backend] { return backend->compute_stream(); });
      };
      CommTimings mine = measure_collectives(*backend, rank, gpus, make_group, grid,
                                             rank == 0 ? progress : std::function<void(int64_t, int64_t)>{});
      if (rank == 0) timings = std::move(mine);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
      if (rank == 0 && !world) {
        try {
          id.set_exception(std::current_exception());
        } catch (const std::future_error&) {  // the id was out already
        }
      }
      if (world) world->abort("rank " + std::to_string(rank) + " failed while profiling collectives");
    }
  };
  std::vector<std::thread> threads;
  for (int64_t rank = 0; rank < gpus; ++rank) threads.emplace_back(body, rank);
  for (std::thread& thread : threads) thread.join();
  if (failure) std::rethrow_exception(failure);
  return timings;
}

}  // namespace megaplan::exec
