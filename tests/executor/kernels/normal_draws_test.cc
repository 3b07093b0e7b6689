// The initial weights' generator (executor/kernels/normal_draws.h): Philox4x32-10 against
// Random123's known answers; the log, sine and cosine built from exact operations against the
// library's; the transform's bits pinned, so that a build that fuses a multiply into an add fails
// here; the normals' moments and distribution; and the CPU backend's draws of a part, under every
// kind of cut, the whole tensor's elements at their places.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <random>
#include <vector>

#include "core/fnv1a.h"
#include "executor/kernels/normal_draws.h"
#include "executor/model/tensor_shards.h"
#include "executor/runtime/cpu_backend.h"

namespace exec = megaplan::exec;

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("Philox4x32-10 gives Random123's known answers", "[kernels][draws]") {
  // Random123's tests/kat_vectors, its three "philox4x32 10" lines: counter, key, result.
  struct Answer {
    r123::Philox4x32::ctr_type counter;
    r123::Philox4x32::key_type key;
    r123::Philox4x32::ctr_type result;
  };
  const Answer answers[] = {
      {{{0, 0, 0, 0}}, {{0, 0}}, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
       {{0xffffffff, 0xffffffff}},
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
       {{0xa4093822, 0x299f31d0}},
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const Answer& answer : answers) CHECK(r123::Philox4x32()(answer.counter, answer.key) == answer.result);
}

TEST_CASE("the portable log, sine and cosine agree with the library's to a few ulps", "[kernels][draws]") {
  // The references in long double (64 significant bits here), so their own rounding does not count.
  REQUIRE(std::numeric_limits<long double>::digits >= 64);
  std::mt19937_64 generator(7);
  // ln u on the uniforms' grid (k / 2^53, k >= 1), near 1 (where ln u is small and cancellation
  // would show), and at the ends and the exponent split's edges. Measured worst: 4.0e-16.
  std::vector<double> us = {0x1p-53,     0.5, 0x1.6a09e667f3bccp-1, 0x1.6a09e667f3bcdp-1, 0x1.6a09e667f3bcep-1,
                            1 - 0x1p-53, 1.0};
  for (int i = 0; i < 200000; ++i) {
    us.push_back(static_cast<double>((generator() >> 11) + 1) * 0x1p-53);
    us.push_back(1.0 - static_cast<double>(generator() >> 40) * 0x1p-53);
  }
  double worst_log = 0;
  for (const double u : us) {
    const long double reference = std::log(static_cast<long double>(u));
    const double ours = exec::portable_log(u);
    if (reference == 0) {
      CHECK(ours == 0);
    } else {
      worst_log = std::max(worst_log, static_cast<double>(std::abs((ours - reference) / reference)));
    }
  }
  CHECK(worst_log <= 0x1p-50);  // 8.9e-16
  // sin and cos of 2 pi turn / 2^53: random turns, and every quarter turn's neighbours (where the
  // reduction switches quadrant) and the eighths between them (the widest rest, pi / 4). An
  // absolute bound: the values lie in [-1, 1]. Measured worst: 1.8e-16.
  constexpr uint64_t kQuarter = uint64_t{1} << 51;
  std::vector<uint64_t> turns;
  for (uint64_t q = 0; q <= 4; ++q) {
    for (const int64_t step : {-1, 0, 1}) {
      for (const uint64_t at : {q * kQuarter, q * kQuarter + kQuarter / 2}) {
        const auto turn = static_cast<int64_t>(at) + step;
        if (turn >= 0 && turn < static_cast<int64_t>(4 * kQuarter)) turns.push_back(static_cast<uint64_t>(turn));
      }
    }
  }
  for (int i = 0; i < 200000; ++i) turns.push_back(generator() >> 11);
  double worst_sin_cos = 0;
  for (const uint64_t turn : turns) {
    const long double angle = 2 * std::numbers::pi_v<long double> * static_cast<long double>(turn) * 0x1p-53L;
    const exec::SinCos ours = exec::portable_sin_cos(turn);
    worst_sin_cos = std::max({worst_sin_cos, static_cast<double>(std::abs(ours.sin - std::sin(angle))),
                              static_cast<double>(std::abs(ours.cos - std::cos(angle)))});
  }
  CHECK(worst_sin_cos <= 0x1p-51);  // 4.4e-16
}

TEST_CASE("the transform's bits are pinned, whatever the compiler and the target", "[kernels][draws]") {
  // Recorded on x86-64 without FMA instructions, where no multiply can be fused into an add; a
  // build that fused them (GCC at -march=haswell without exact_product's guard) moves about 6% of
  // these doubles. Cross-checked against Python's Philox and math library to 1e-15.
  const exec::NormalDraws draws{1234, 0x0123456789abcdefull, 0.02, {}};
  CHECK(draws.standard_pair(0).even == 0x1.76f1b64dddafp+0);
  CHECK(draws.standard_pair(0).odd == -0x1.216b82941eae7p+0);
  CHECK(draws.standard_pair(1).even == 0x1.dc2ad37c072d2p-1);
  CHECK(draws.standard_pair(1).odd == 0x1.b12f8e68488f8p-2);
  megaplan::Fnv1a64 hash;
  for (uint64_t j = 0; j < 4096; ++j) {
    const exec::StandardPair pair = draws.standard_pair(j);
    hash.add(&pair.even, sizeof pair.even).add(&pair.odd, sizeof pair.odd);
  }
  CHECK(hash.value() == 0xf165fb8d8006accfull);
  // sigma x the standard normal, rounded once to float.
  CHECK(draws.whole_value(0) == 0x1.dfedb6p-6f);
  CHECK(draws.whole_value(1) == -0x1.727522p-6f);
}

TEST_CASE("the draws have the standard normal's moments and distribution", "[kernels][draws]") {
  // 2^20 draws: each moment within 5 standard errors (mean 1/sqrt(n), variance sqrt(2/n), third
  // moment sqrt(15/n), fourth sqrt(96/n)); Kolmogorov-Smirnov's distance to the normal CDF below
  // its 0.1% critical value 1.95/sqrt(n); the two normals of one draw uncorrelated.
  const exec::NormalDraws draws{42, 0xfeedfacecafebeefull, 1.0, {}};
  const std::size_t n = std::size_t{1} << 20;
  std::vector<double> values(n);
  double sum[5] = {};
  double pair_product = 0;
  for (std::size_t i = 0; i < n; ++i) {
    values[i] = draws.whole_value(i);
    double power = 1;
    for (double& s : sum) {
      s += power;
      power *= values[i];
    }
    if (i % 2) pair_product += values[i - 1] * values[i];
  }
  const double count = static_cast<double>(n);
  CHECK(std::abs(sum[1] / count) < 5 / std::sqrt(count));
  CHECK(std::abs(sum[2] / count - 1) < 5 * std::sqrt(2 / count));
  CHECK(std::abs(sum[3] / count) < 5 * std::sqrt(15 / count));
  CHECK(std::abs(sum[4] / count - 3) < 5 * std::sqrt(96 / count));
  CHECK(std::abs(pair_product / (count / 2)) < 5 / std::sqrt(count / 2));
  std::sort(values.begin(), values.end());
  double distance = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double cdf = 0.5 * std::erfc(-values[i] / std::numbers::sqrt2);
    distance = std::max({distance, cdf - static_cast<double>(i) / count, static_cast<double>(i + 1) / count - cdf});
  }
  CHECK(distance < 1.95 / std::sqrt(count));
}

TEST_CASE("the CPU backend draws a part's elements as the whole tensor's at their places", "[kernels][draws]") {
  // Column-parallel, row-parallel (runs of odd length: pairs split across runs), two blocks cut
  // alike (SwiGLU's fc1), a third of the columns (runs starting at odd places of the whole) and
  // the whole tensor; each part equals the whole tensor drawn and cut by reshard, bit for bit.
  struct Case {
    std::vector<int64_t> shape;
    exec::TensorCut cut;
  };
  const std::vector<Case> cases = {
      {{6, 10}, {}},          {{6, 10}, {0, 1, 2}},   {{6, 10}, {1, 1, 2}}, {{3, 6}, {1, 0, 2}},
      {{3, 6}, {1, 1, 2}},    {{8, 5}, {0, 1, 2, 2}}, {{5, 9}, {1, 1, 3}},  {{7}, {}},
      {{2, 3, 4}, {1, 2, 3}}, {{8, 3}, {0, 3, 4, 2}},
  };
  exec::CpuBackend backend;
  for (const Case& c : cases) {
    INFO(exec::shape_text(c.shape) << ", part " << c.cut.index << " of " << c.cut.count << " along " << c.cut.dim
                                   << " in " << c.cut.chunks << " blocks");
    const std::size_t total = exec::elements(c.shape);
    const exec::NormalDraws whole_draws{99, 0x5eed, 0.02, exec::part_placement(c.shape, {})};
    std::vector<float> whole(total);
    backend.draw_normal(whole.data(), total, whole_draws);
    for (std::size_t i = 0; i < total; ++i) CHECK(whole[i] == whole_draws.whole_value(i));

    exec::NormalDraws part_draws = whole_draws;
    part_draws.part = exec::part_placement(c.shape, c.cut);
    const std::size_t size = total / static_cast<std::size_t>(c.cut.count);
    std::vector<float> part(size, std::numeric_limits<float>::quiet_NaN());
    backend.draw_normal(part.data(), size, part_draws);
    CHECK(same_bits(part, exec::reshard({whole}, {}, c.shape, c.cut)));
  }
}
