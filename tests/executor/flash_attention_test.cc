// Flash attention against a double-precision reference on the same rounded inputs, in bf16 and in
// fp16: head dims 64 and 128, sequences that are not multiples of the tile, grouped-query
// attention, Megatron's packed qkv layout; outputs poisoned first; the backward bit-identical
// across runs.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/implementation_options.h"
#include "executor/kernels/cuda/flash_attention.h"
#include "executor/kernels/cuda/stream.h"
#include "relative_error.h"

namespace cu = megaplan::exec::cuda;

namespace {

using megaplan::Precision;
using megaplan::test::relative_error;

struct Case {
  int64_t batch, seq, heads, kv_heads, dim;
};

// ||got - want|| / ||want||; the absolute norm of the difference where want is all zeros (a
// one-token sequence has zero dq and dk: its softmax is constant).
}  // namespace

TEST_CASE("flash attention matches a double-precision reference, forward and backward", "[gpu][kernels]") {
  const Precision precision = GENERATE(Precision::kBf16, Precision::kFp16);
  INFO(megaplan::to_string(precision));
  // P and dS are rounded to the inputs' type before their products, and the outputs once: fp16
  // keeps 3 more bits than bf16 (measured on an H200: at most 3.4e-4 in fp16, 2.7e-3 in bf16).
  const double tolerance = precision == Precision::kFp16 ? 2e-3 : 1e-2;
  const auto round = [precision](float value) { return cu::from_half(cu::to_half(value, precision), precision); };
  std::mt19937 generator(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const cu::Stream stream;
  for (const Case c : {Case{2, 37, 3, 3, 64}, Case{1, 200, 4, 2, 128}, Case{2, 1, 2, 2, 64}, Case{1, 130, 2, 2, 128},
                       Case{1, 64, 4, 1, 64}}) {
    INFO("batch " << c.batch << ", seq " << c.seq << ", heads " << c.heads << ", kv heads " << c.kv_heads << ", dim "
                  << c.dim);
    const int64_t group = c.heads / c.kv_heads, d = c.dim;
    const int64_t head_stride = (group + 2) * d, token_stride = c.kv_heads * head_stride;
    const int64_t tokens = c.batch * c.seq;
    std::vector<float> qkv(static_cast<std::size_t>(tokens * token_stride));
    for (float& value : qkv) value = round(normal(generator));
    std::vector<float> dout(static_cast<std::size_t>(tokens * c.heads * d));
    for (float& value : dout) value = round(normal(generator));
    const auto q_at = [&](int64_t b, int64_t t, int64_t h, int64_t e) {
      return static_cast<double>(qkv[static_cast<std::size_t>((b * c.seq + t) * token_stride + (h / group) * head_stride + (h % group) * d + e)]);
    };
    const auto k_at = [&](int64_t b, int64_t t, int64_t g, int64_t e) {
      return static_cast<double>(qkv[static_cast<std::size_t>((b * c.seq + t) * token_stride + g * head_stride + group * d + e)]);
    };
    const auto v_at = [&](int64_t b, int64_t t, int64_t g, int64_t e) {
      return static_cast<double>(qkv[static_cast<std::size_t>((b * c.seq + t) * token_stride + g * head_stride + (group + 1) * d + e)]);
    };
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));

    // The reference: softmax rows, outputs, log-sum-exp, and the gradients into a packed dqkv.
    std::vector<double> want_out(dout.size()), want_lse(static_cast<std::size_t>(c.batch * c.heads * c.seq)),
        want_dqkv(qkv.size(), 0.0);
    for (int64_t b = 0; b < c.batch; ++b) {
      for (int64_t h = 0; h < c.heads; ++h) {
        const int64_t g = h / group;
        for (int64_t i = 0; i < c.seq; ++i) {
          std::vector<double> p(static_cast<std::size_t>(i + 1)), dp(p.size());
          double row_max = -INFINITY;
          for (int64_t j = 0; j <= i; ++j) {
            double s = 0;
            for (int64_t e = 0; e < d; ++e) s += q_at(b, i, h, e) * k_at(b, j, g, e);
            p[static_cast<std::size_t>(j)] = s * scale;
            row_max = std::max(row_max, s * scale);
          }
          double sum = 0;
          for (double& value : p) sum += (value = std::exp(value - row_max));
          for (double& value : p) value /= sum;
          want_lse[static_cast<std::size_t>((b * c.heads + h) * c.seq + i)] = row_max + std::log(sum);
          const std::size_t o_row = static_cast<std::size_t>(((b * c.seq + i) * c.heads + h) * d);
          for (int64_t e = 0; e < d; ++e) {
            double o = 0;
            for (int64_t j = 0; j <= i; ++j) o += p[static_cast<std::size_t>(j)] * v_at(b, j, g, e);
            want_out[o_row + static_cast<std::size_t>(e)] = o;
          }
          double row_dot = 0;
          for (int64_t j = 0; j <= i; ++j) {
            double value = 0;
            for (int64_t e = 0; e < d; ++e) value += dout[o_row + static_cast<std::size_t>(e)] * v_at(b, j, g, e);
            dp[static_cast<std::size_t>(j)] = value;
            row_dot += p[static_cast<std::size_t>(j)] * value;
          }
          for (int64_t j = 0; j <= i; ++j) {
            const double pj = p[static_cast<std::size_t>(j)];
            const double ds = pj * (dp[static_cast<std::size_t>(j)] - row_dot);
            const int64_t qi = (b * c.seq + i) * token_stride + (h / group) * head_stride + (h % group) * d;
            const int64_t kj = (b * c.seq + j) * token_stride + g * head_stride + group * d;
            const int64_t vj = kj + d;
            for (int64_t e = 0; e < d; ++e) {
              want_dqkv[static_cast<std::size_t>(qi + e)] += scale * ds * k_at(b, j, g, e);
              want_dqkv[static_cast<std::size_t>(kj + e)] += scale * ds * q_at(b, i, h, e);
              want_dqkv[static_cast<std::size_t>(vj + e)] += pj * dout[o_row + static_cast<std::size_t>(e)];
            }
          }
        }
      }
    }

    cu::Half* qkv_device = cu::upload_half(qkv, precision, stream);
    cu::Half* dout_device = cu::upload_half(dout, precision, stream);
    cu::Half* out = cu::upload_half(std::vector<float>(dout.size(), 1e30f), precision, stream);  // poisoned
    float* lse = cu::upload_floats(std::vector<float>(want_lse.size(), NAN), stream);
    cu::Half* dqkv = cu::upload_half(std::vector<float>(qkv.size(), 1e30f), precision, stream);
    const cu::AttentionShape shape{c.batch, c.seq, c.heads, c.kv_heads, d, token_stride, head_stride,
                                   static_cast<float>(scale)};
    const cu::Half *q = qkv_device, *k = qkv_device + group * d, *v = qkv_device + (group + 1) * d;
    cu::flash_attention_forward(shape, q, k, v, out, lse, precision, stream);
    CHECK(relative_error(cu::download_half(out, dout.size(), precision, stream), want_out) < tolerance);
    CHECK(relative_error(cu::download_floats(lse, want_lse.size(), stream), want_lse) < 1e-3);

    float* workspace =
        cu::upload_floats(std::vector<float>(cu::flash_attention_backward_workspace_bytes(shape) / 4), stream);
    cu::flash_attention_backward(shape, dout_device, q, k, v, out, lse, token_stride, dqkv, dqkv + group * d,
                                 dqkv + (group + 1) * d, workspace, precision, stream);
    const std::vector<float> first = cu::download_half(dqkv, qkv.size(), precision, stream);
    // dq, dk and dv separately: within a key-value head's slot, group * d query values, d key, d value.
    for (int part = 0; part < 3; ++part) {
      INFO((part == 0 ? "dq" : part == 1 ? "dk" : "dv"));
      std::vector<float> got_part;
      std::vector<double> want_part;
      for (std::size_t i = 0; i < first.size(); ++i) {
        const int64_t offset = static_cast<int64_t>(i) % head_stride;
        const int which = offset < group * d ? 0 : offset < (group + 1) * d ? 1 : 2;
        if (which != part) continue;
        got_part.push_back(first[i]);
        want_part.push_back(want_dqkv[i]);
      }
      CHECK(relative_error(got_part, want_part) < tolerance);
    }
    cu::flash_attention_backward(shape, dout_device, q, k, v, out, lse, token_stride, dqkv, dqkv + group * d,
                                 dqkv + (group + 1) * d, workspace, precision, stream);
    const std::vector<float> second = cu::download_half(dqkv, qkv.size(), precision, stream);
    CHECK(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)) == 0);  // deterministic
    for (void* buffer : {static_cast<void*>(qkv_device), static_cast<void*>(dout_device), static_cast<void*>(out),
                         static_cast<void*>(lse), static_cast<void*>(dqkv), static_cast<void*>(workspace)}) {
      cu::free_device(buffer);
    }
  }
}

TEST_CASE("flash attention refuses head dimensions it has no kernel for", "[gpu][kernels]") {
  const cu::AttentionShape shape{1, 8, 2, 2, 80, 480, 240, 0.1f};
  const cu::Stream stream;
  for (const Precision precision : {Precision::kBf16, Precision::kFp16}) {
    CHECK_THROWS_WITH(
        cu::flash_attention_forward(shape, nullptr, nullptr, nullptr, nullptr, nullptr, precision, stream),
        Catch::Contains("head dimensions 64 and 128, got 80"));
  }
}
