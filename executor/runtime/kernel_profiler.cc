#include "executor/runtime/kernel_profiler.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>

#include "executor/runtime/kernel_launch.h"

namespace megaplan::exec {

namespace {

// Launches rotate over copies of a kernel's buffers holding at least this many bytes in all, four
// times the 50 MB L2 of an H100 or H200: each launch reads its operands from HBM, as training's
// kernels mostly do, not from the cache the previous launch of the same kernel filled.
constexpr int64_t kRotatedBytes = int64_t{200} << 20;
constexpr int64_t kMaxCopies = 64;

// One point's launches, in turn over its copies. The optimizer's kernels keep one: the backend
// prepares a launch per tensor list (as training's list never changes), which rotating would redo.
class RotatedLaunch {
 public:
  RotatedLaunch(Backend& backend, const Kernel& kernel, int64_t kernel_bytes) {
    const bool one_list = kernel.kind == KernelKind::kAdamw || kernel.kind == KernelKind::kGradientNorm;
    const int64_t copies =
        one_list ? 1 : std::clamp<int64_t>((kRotatedBytes + kernel_bytes - 1) / std::max<int64_t>(kernel_bytes, 1), 1, kMaxCopies);
    for (int64_t i = 0; i < copies; ++i) launches_.push_back(std::make_unique<KernelLaunch>(backend, kernel));
  }
  void operator()() {
    (*launches_[next_])();
    next_ = (next_ + 1) % launches_.size();
  }

 private:
  std::vector<std::unique_ptr<KernelLaunch>> launches_;
  std::size_t next_ = 0;
};

struct Timing {
  double median_s;
  double spread;  // (p90 - p10) / median
};

Timing time_kernel(Backend& backend, const ProfileGrid& grid, const std::function<void()>& launch) {
  // Seconds per launch over `count` launches back to back.
  const auto timed = [&](int64_t count) {
    const TimingMark from = backend.mark();
    for (int64_t i = 0; i < count; ++i) launch();
    const TimingMark to = backend.mark();
    const double seconds = backend.seconds_between(from, to) / static_cast<double>(count);
    backend.release_marks();
    return seconds;
  };
  // A first launch (cuBLASLt picks its algorithm, caches fill) sizes the batches.
  const double first = std::max(timed(1), 1e-9);
  const auto launches_in = [&](double seconds) { return std::max<int64_t>(1, static_cast<int64_t>(seconds / first)); };
  (void)timed(launches_in(grid.warmup_seconds));
  const int64_t batch = launches_in(grid.batch_seconds);
  const double wanted = grid.target_seconds / (first * static_cast<double>(batch));
  const int repetitions = std::clamp(static_cast<int>(std::ceil(wanted)), grid.min_repetitions, grid.max_repetitions);
  std::vector<double> seconds;
  for (int i = 0; i < repetitions; ++i) seconds.push_back(timed(batch));
  std::sort(seconds.begin(), seconds.end());
  const auto at = [&](double quantile) {
    return seconds[static_cast<std::size_t>(quantile * static_cast<double>(seconds.size() - 1) + 0.5)];
  };
  // A CPU kernel too quick for the steady clock reads 0: the schema wants a positive time.
  const double median = std::max(at(0.5), 1e-9);
  return {median, (at(0.9) - at(0.1)) / median};
}

// A GPT layer of width h as plans make them: heads of 64, a 4h MLP, GPT-2's vocabulary, 1024-token
// sequences (so that `tokens` is a whole number of them).
ModelSpec gpt_of_width(int64_t hidden, int64_t tokens) {
  ModelSpec model;
  model.name = "profile";
  model.num_layers = 1;
  model.hidden_size = hidden;
  model.num_attention_heads = hidden / 64;
  model.seq_length = std::min<int64_t>(tokens, 1024);
  model.vocab_size = 50257;
  return model;
}

}  // namespace

ProfileGrid profile_grid(bool quick) {
  const std::vector<int64_t> tokens = quick ? std::vector<int64_t>{2048, 8192} : std::vector<int64_t>{1024, 2048, 4096, 8192, 16384};
  const std::vector<int64_t> widths = quick ? std::vector<int64_t>{768, 2048, 4096} : std::vector<int64_t>{768, 1024, 2048, 4096, 8192};
  const std::vector<int64_t> shards = quick ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 2, 4, 8};
  ProfileGrid grid;
  // Distinct points only: GEMMs by shape, layout and epilogue; memory-bound kernels by class and
  // bytes, the x-axis of their curves.
  std::set<std::tuple<int64_t, int64_t, int64_t, GemmLayout, GemmEpilogue>> gemms;
  std::set<std::pair<std::string, int64_t>> memory_bound;
  const auto add = [&](const Kernel& kernel) {
    if (kernel.kind == KernelKind::kAttentionForward || kernel.kind == KernelKind::kAttentionBackward ||
        kernel.kind == KernelKind::kElementwise) {
      return;  // attention has its own grid; the executor launches no kElementwise
    }
    const bool fresh = kernel.kind == KernelKind::kGemm
                           ? gemms.emplace(kernel.m, kernel.n, kernel.k, kernel.layout, kernel.epilogue).second
                           : memory_bound.emplace(memory_kernel_class(kernel), kernel_bytes(kernel, 2)).second;
    if (fresh) grid.kernels.push_back(kernel);
  };
  for (const int64_t m : tokens) {
    for (const int64_t h : widths) {
      for (const int64_t t : shards) {
        const ModelSpec model = gpt_of_width(h, m);
        ParallelPlan plan;
        plan.tensor_parallel_size = t;
        plan.micro_batch_size = m / model.seq_length;
        const PlanKernels list(model, plan);
        for (std::size_t b = 0; b < kNumKernelBlocks; ++b) {
          for (const Kernel& kernel : list.block(static_cast<KernelBlock>(b))) add(kernel);
        }
      }
    }
  }
  const std::vector<int64_t> sequences = quick ? std::vector<int64_t>{1024, 4096} : std::vector<int64_t>{1024, 2048, 4096, 8192};
  const std::vector<int64_t> batch_heads = quick ? std::vector<int64_t>{16, 64} : std::vector<int64_t>{8, 16, 32, 64, 128};
  for (const int64_t seq : sequences) {
    for (const int64_t bh : batch_heads) {
      for (const int64_t dim : {int64_t{64}, int64_t{128}}) {
        grid.kernels.push_back(attention_kernel(KernelKind::kAttentionForward, 1, seq, bh, dim));
      }
    }
  }
  // The optimizer's kernels over 1 Mi to 1 Gi parameters (quick: 4 Mi and 64 Mi).
  const int64_t smallest = int64_t{1} << (quick ? 22 : 20), largest = int64_t{1} << (quick ? 26 : 30);
  for (int64_t n = smallest; n <= largest; n *= quick ? 16 : 4) {
    for (const KernelKind kind : {KernelKind::kGradientNorm, KernelKind::kAdamw, KernelKind::kRefreshCompute, KernelKind::kFill}) {
      add(flat_kernel(kind, n));
    }
  }
  return grid;
}

MeasuredTables measure_kernels(Backend& backend, const ProfileGrid& grid,
                               const std::function<void(int64_t done, int64_t total)>& progress) {
  if (grid.min_repetitions < 1 || grid.max_repetitions < grid.min_repetitions) {
    throw std::invalid_argument("measure_kernels: repetitions must satisfy 1 <= min <= max");
  }
  const auto total = static_cast<int64_t>(grid.kernels.size());
  int64_t done = 0;
  const std::string dtype = backend.activation_bytes() == sizeof(float) ? "fp32" : "bf16";
  const auto activation_bytes = static_cast<int64_t>(backend.activation_bytes());
  MeasuredTables tables;
  for (const Kernel& kernel : grid.kernels) {
    if (kernel.kind == KernelKind::kAttentionForward) {
      Kernel backward = kernel;
      backward.kind = KernelKind::kAttentionBackward;
      RotatedLaunch forward_launch(backend, kernel, kernel_bytes(kernel, activation_bytes));
      RotatedLaunch backward_launch(backend, backward, kernel_bytes(backward, activation_bytes));
      const Timing forward = time_kernel(backend, grid, [&] { forward_launch(); });
      const Timing backward_timing = time_kernel(backend, grid, [&] { backward_launch(); });
      tables.attention.push_back({{"batch_heads", kernel.batch * kernel.heads},
                                  {"seq", kernel.seq},
                                  {"head_dim", kernel.head_dim},
                                  {"causal", true},
                                  {"forward_s", forward.median_s},
                                  {"backward_s", backward_timing.median_s},
                                  {"spread", std::max(forward.spread, backward_timing.spread)}});
    } else if (kernel.kind == KernelKind::kGemm) {
      RotatedLaunch launch(backend, kernel, kernel_bytes(kernel, activation_bytes));
      const Timing timing = time_kernel(backend, grid, [&] { launch(); });
      tables.gemm.push_back({{"m", kernel.m},
                             {"n", kernel.n},
                             {"k", kernel.k},
                             {"dtype", dtype},
                             {"layout", to_string(kernel.layout)},
                             {"epilogue", to_string(kernel.epilogue)},
                             {"seconds", timing.median_s},
                             {"spread", timing.spread}});
    } else {
      RotatedLaunch launch(backend, kernel, kernel_bytes(kernel, activation_bytes));
      const Timing timing = time_kernel(backend, grid, [&] { launch(); });
      tables.kernels.push_back({{"kernel", memory_kernel_class(kernel)},
                                {"bytes", kernel_bytes(kernel, activation_bytes)},
                                {"seconds", timing.median_s},
                                {"spread", timing.spread}});
    }
    if (progress) progress(++done, total);
  }
  return tables;
}

}  // namespace megaplan::exec
