#include "executor/runtime/kernel_profiler.h"

#include <algorithm>
#include <set>
#include <stdexcept>

namespace megaplan::exec {

namespace {

struct Timing {
  double median_s;
  double spread;  // (p90 - p10) / median
};

Timing time_kernel(Backend& backend, const ProfileGrid& grid, const std::function<void()>& launch) {
  for (int i = 0; i < grid.warmup; ++i) launch();
  std::vector<double> seconds;
  seconds.reserve(static_cast<std::size_t>(grid.repetitions));
  for (int i = 0; i < grid.repetitions; ++i) {
    const TimingMark from = backend.mark();
    launch();
    const TimingMark to = backend.mark();
    seconds.push_back(backend.seconds_between(from, to));
    backend.release_marks();
  }
  std::sort(seconds.begin(), seconds.end());
  const auto at = [&](double quantile) {
    return seconds[static_cast<std::size_t>(quantile * static_cast<double>(seconds.size() - 1) + 0.5)];
  };
  // A CPU kernel too quick for the steady clock reads 0: the schema wants a positive time.
  const double median = std::max(at(0.5), 1e-9);
  return {median, (at(0.9) - at(0.1)) / median};
}

}  // namespace

ProfileGrid profile_grid(bool quick) {
  ProfileGrid grid;
  const std::vector<int64_t> tokens = quick ? std::vector<int64_t>{2048, 8192} : std::vector<int64_t>{2048, 4096, 8192, 16384};
  const std::vector<int64_t> widths = quick ? std::vector<int64_t>{768, 2048, 4096} : std::vector<int64_t>{768, 1024, 2048, 4096, 8192};
  const std::vector<int64_t> shards = quick ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 2, 4, 8};
  std::set<std::array<int64_t, 3>> gemms;  // distinct: shards of different widths can coincide
  for (const int64_t m : tokens) {
    for (const int64_t h : widths) {
      for (const int64_t t : shards) {
        gemms.insert({m, 3 * h / t, h});  // qkv, column-parallel
        gemms.insert({m, h, h / t});      // projection, row-parallel
        gemms.insert({m, 4 * h / t, h});  // fc1, column-parallel
        gemms.insert({m, h, 4 * h / t});  // fc2, row-parallel
      }
    }
  }
  grid.gemms.assign(gemms.begin(), gemms.end());
  const std::vector<int64_t> sequences = quick ? std::vector<int64_t>{1024, 4096} : std::vector<int64_t>{1024, 2048, 4096, 8192};
  const std::vector<int64_t> batch_heads = quick ? std::vector<int64_t>{16, 64} : std::vector<int64_t>{8, 16, 32, 64, 128};
  for (const int64_t seq : sequences) {
    for (const int64_t bh : batch_heads) {
      for (const int64_t dim : {int64_t{64}, int64_t{128}}) grid.attention.push_back({bh, seq, dim});
    }
  }
  for (int64_t n = int64_t{1} << 16; n <= (int64_t{1} << 28); n *= quick ? 16 : 4) grid.elementwise_elements.push_back(n);
  if (quick) grid.repetitions = 5;
  return grid;
}

MeasuredTables measure_kernels(Backend& backend, const ProfileGrid& grid,
                               const std::function<void(int64_t done, int64_t total)>& progress) {
  if (grid.repetitions < 1 || grid.warmup < 0) {
    throw std::invalid_argument("measure_kernels: repetitions < 1 or warmup < 0");
  }
  const auto total = static_cast<int64_t>(grid.gemms.size() + grid.attention.size() + grid.elementwise_elements.size());
  int64_t done = 0;
  const auto step = [&] {
    if (progress) progress(++done, total);
  };
  const auto size = [](int64_t a, int64_t b) { return static_cast<std::size_t>(a * b); };
  const std::string dtype = backend.activation_bytes() == sizeof(float) ? "fp32" : "bf16";
  MeasuredTables tables;

  for (const auto& [m, n, k] : grid.gemms) {
    Activation x = backend.allocate_activation(size(m, k));
    Activation w = backend.allocate_activation(size(n, k));
    Activation y = backend.allocate_activation(size(m, n));
    const Timing timing = time_kernel(backend, grid, [&] {
      backend.linear_forward(x, w, nullptr, static_cast<std::size_t>(m), static_cast<std::size_t>(k),
                             static_cast<std::size_t>(n), LinearEpilogue::kNone, y, nullptr);
    });
    for (Activation buffer : {x, w, y}) backend.release(buffer);
    tables.gemm.push_back(
        {{"m", m}, {"n", n}, {"k", k}, {"dtype", dtype}, {"seconds", timing.median_s}, {"spread", timing.spread}});
    step();
  }

  for (const AttentionPoint& point : grid.attention) {
    // One sequence batch of batch_heads heads: the kernels' work depends on their product.
    const auto heads = static_cast<std::size_t>(point.batch_heads);
    const auto seq = static_cast<std::size_t>(point.seq);
    const auto dim = static_cast<std::size_t>(point.head_dim);
    Activation qkv = backend.allocate_activation(seq * heads * 3 * dim);
    Activation out = backend.allocate_activation(seq * heads * dim);
    Activation d_out = backend.allocate_activation(seq * heads * dim);
    Activation d_qkv = backend.allocate_activation(seq * heads * 3 * dim);
    float* saved = backend.allocate(backend.attention_saved_size(1, seq, heads, dim));
    const Timing forward = time_kernel(backend, grid, [&] { backend.attention_forward(qkv, 1, seq, heads, dim, out, saved); });
    const Timing backward = time_kernel(
        backend, grid, [&] { backend.attention_backward(d_out, qkv, out, saved, 1, seq, heads, dim, d_qkv); });
    for (Activation buffer : {qkv, out, d_out, d_qkv}) backend.release(buffer);
    backend.release(saved);
    tables.attention.push_back({{"batch_heads", point.batch_heads},
                                {"seq", point.seq},
                                {"head_dim", point.head_dim},
                                {"causal", true},
                                {"forward_s", forward.median_s},
                                {"backward_s", backward.median_s},
                                {"spread", std::max(forward.spread, backward.spread)}});
    step();
  }

  for (const int64_t elements : grid.elementwise_elements) {
    const auto n = static_cast<std::size_t>(elements);
    Activation a = backend.allocate_activation(n);
    Activation b = backend.allocate_activation(n);
    Activation y = backend.allocate_activation(n);
    const Timing timing = time_kernel(backend, grid, [&] { backend.add(a, b, n, y); });
    for (Activation buffer : {a, b, y}) backend.release(buffer);
    // Two operands read and one result written.
    tables.elementwise.push_back({{"bytes", 3 * elements * static_cast<int64_t>(backend.activation_bytes())},
                                  {"seconds", timing.median_s},
                                  {"spread", timing.spread}});
    step();
  }
  return tables;
}

}  // namespace megaplan::exec
