// The CUDA dropout against the mask's own definition, element by element and bit for bit (kept
// values x * scale rounded once, dropped ones exactly 0; with the residual add fused, the sum
// rounded once), in bf16 and fp16, in place and out of place, aligned and unaligned rows, a rank's rows that start
// mid-sequence; the kept fraction of a large tensor; and the keep bits that flash attention's lanes draw between them.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/implementation_options.h"
#include "executor/kernels/cuda/bf16_linear.h"
#include "executor/kernels/cuda/dropout.h"
#include "executor/kernels/cuda/stream.h"
#include "executor/kernels/dropout_mask.h"

namespace cu = megaplan::exec::cuda;
using megaplan::DType;
using megaplan::exec::dropout_site;
using megaplan::exec::DropoutKind;
using megaplan::exec::DropoutMask;

namespace {

DropoutMask test_mask(float probability, int64_t seq, int64_t first_row) {
  DropoutMask mask;
  mask.probability = probability;
  mask.seed = 0x0123456789abcdefull;
  mask.site = dropout_site(5, DropoutKind::kMlpBranch);
  mask.first_sample = 4099;
  mask.seq = seq;
  mask.first_row = first_row;
  return mask;
}

float round_to(DType precision, float value) { return cu::from_half(cu::to_half(value, precision), precision); }

// The values as bits: +0 and -0 differ, and so do a kept value and its unscaled self.
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("dropout keeps exactly the mask's elements, scaled once", "[gpu][kernels]") {
  const DType precision = GENERATE(DType::kBFloat16, DType::kFloat16);
  INFO(megaplan::to_string(precision));
  std::mt19937 generator(31);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const cu::Stream stream;
  struct Shape {
    int64_t rows, cols, seq, first_row;
  };
  // Rows of 8k values (16-byte accesses, two draws per thread), odd widths (scalar accesses, runs
  // that start mid-draw), a rank's slice that begins inside a sequence.
  for (const Shape s : {Shape{37, 1024, 16, 0}, Shape{9, 13, 7, 3}, Shape{50, 1000, 20, 45}, Shape{3, 1, 2, 1}}) {
    INFO("rows " << s.rows << ", cols " << s.cols << ", seq " << s.seq << ", first row " << s.first_row);
    const DropoutMask mask = test_mask(0.25f, s.seq, s.first_row);
    const auto n = static_cast<std::size_t>(s.rows * s.cols);
    std::vector<float> x(n), want(n);
    for (float& value : x) value = round_to(precision, normal(generator));
    std::size_t kept = 0;
    for (int64_t r = 0; r < s.rows; ++r) {
      for (int64_t c = 0; c < s.cols; ++c) {
        const auto i = static_cast<std::size_t>(r * s.cols + c);
        const bool keep = mask.keeps_token(r, c, s.cols);
        want[i] = keep ? round_to(precision, x[i] * mask.scale()) : 0.0f;
        kept += keep;
      }
    }
    if (n > 100) CHECK((kept > 0 && kept < n));  // both branches exercised

    cu::Half* d_x = cu::upload_half(x, precision, stream);
    cu::Half* d_y = cu::upload_half(std::vector<float>(n, 1e30f), precision, stream);  // poisoned
    cu::dropout(d_x, nullptr, s.rows, s.cols, mask, d_y, precision, stream);
    CHECK(same_bits(cu::download_half(d_y, n, precision, stream), want));
    CHECK(same_bits(cu::download_half(d_x, n, precision, stream), x));  // the input untouched

    // The dropout-add: residual + the kept values scaled, in fp32, rounded once; in place on the residual.
    std::vector<float> residual(n), want_sum(n);
    for (std::size_t i = 0; i < n; ++i) {
      residual[i] = round_to(precision, normal(generator));
      const bool keep = mask.keeps_token(static_cast<int64_t>(i) / s.cols, static_cast<int64_t>(i) % s.cols, s.cols);
      want_sum[i] = round_to(precision, residual[i] + (keep ? x[i] * mask.scale() : 0.0f));
    }
    cu::Half* d_residual = cu::upload_half(residual, precision, stream);
    cu::dropout(d_x, d_residual, s.rows, s.cols, mask, d_y, precision, stream);
    CHECK(same_bits(cu::download_half(d_y, n, precision, stream), want_sum));
    cu::dropout(d_x, d_residual, s.rows, s.cols, mask, d_residual, precision, stream);
    CHECK(same_bits(cu::download_half(d_residual, n, precision, stream), want_sum));

    cu::dropout(d_x, nullptr, s.rows, s.cols, mask, d_x, precision, stream);  // in place
    CHECK(same_bits(cu::download_half(d_x, n, precision, stream), want));

    // An inactive mask copies (and in place leaves x as it is), or adds.
    cu::Half* d_fresh = cu::upload_half(x, precision, stream);
    cu::dropout(d_fresh, nullptr, s.rows, s.cols, DropoutMask{}, d_y, precision, stream);
    CHECK(same_bits(cu::download_half(d_y, n, precision, stream), x));
    cu::dropout(d_fresh, nullptr, s.rows, s.cols, DropoutMask{}, d_fresh, precision, stream);
    CHECK(same_bits(cu::download_half(d_fresh, n, precision, stream), x));
    std::vector<float> want_plain(n);
    for (std::size_t i = 0; i < n; ++i) want_plain[i] = round_to(precision, x[i] + residual[i]);
    cu::Half* d_plain = cu::upload_half(residual, precision, stream);
    cu::dropout(d_fresh, d_plain, s.rows, s.cols, DropoutMask{}, d_y, precision, stream);
    CHECK(same_bits(cu::download_half(d_y, n, precision, stream), want_plain));
    for (void* buffer : {static_cast<void*>(d_x), static_cast<void*>(d_y), static_cast<void*>(d_fresh),
                         static_cast<void*>(d_residual), static_cast<void*>(d_plain)}) {
      cu::free_device(buffer);
    }
  }
}

TEST_CASE("dropout keeps 1 - p of a large tensor", "[gpu][kernels]") {
  const DType precision = DType::kBFloat16;
  const cu::Stream stream;
  const int64_t rows = 2048, cols = 2048;
  const auto n = static_cast<std::size_t>(rows * cols);
  for (const float probability : {0.1f, 0.5f}) {
    INFO("p " << probability);
    const DropoutMask mask = test_mask(probability, 1024, 0);
    cu::Half* d_x = cu::upload_half(std::vector<float>(n, 1.0f), precision, stream);
    cu::dropout(d_x, nullptr, rows, cols, mask, d_x, precision, stream);
    const std::vector<float> y = cu::download_half(d_x, n, precision, stream);
    cu::free_device(d_x);
    std::size_t kept = 0;
    for (const float value : y) kept += value != 0.0f;
    const double fraction = static_cast<double>(kept) / static_cast<double>(n);
    CHECK(std::abs(fraction - (1.0 - probability)) < 0.01 * (1.0 - probability));
  }
}

TEST_CASE("dropout_keep_bits: a run's keep bits, its draws split between threads", "[gpu][kernels]") {
  const DropoutMask mask = test_mask(0.5f, 128, 0);
  for (const uint64_t first : {uint64_t{0}, uint64_t{5}, uint64_t{1022}, uint64_t{(1ull << 33) + 3}}) {
    for (const int count : {1, 3, 8, 16, 61, 64}) {
      INFO("first " << first << ", count " << count);
      uint64_t want = 0;
      for (int i = 0; i < count; ++i)
        want |= static_cast<uint64_t>(mask.keeps(7, first + static_cast<uint64_t>(i))) << i;
      CHECK(cu::dropout_keep_bits(mask, 7, first, count, 0, 1) == want);
      CHECK((cu::dropout_keep_bits(mask, 7, first, count, 0, 2) | cu::dropout_keep_bits(mask, 7, first, count, 1, 2)) ==
            want);
    }
  }
}
