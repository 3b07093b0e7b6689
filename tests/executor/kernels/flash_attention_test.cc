// Flash attention against a double-precision reference on the same rounded inputs, in bf16 and in
// fp16: head dims 64 and 128, sequences that are not multiples of the tile, grouped-query
// attention, Megatron's packed qkv layout; outputs poisoned first; the backward bit-identical
// across runs. With dropout on the probabilities: the same against the reference that draws the
// mask from its definition, the dropped probabilities exactly the mask's in the forward and in
// dV, and p = 0 the kernels without dropout bit for bit.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/implementation_options.h"
#include "executor/kernels/cuda/flash_attention.h"
#include "executor/kernels/cuda/stream.h"
#include "executor/kernels/dropout_mask.h"
#include "tests/executor/kernels/relative_error.h"

namespace cu = megaplan::exec::cuda;

namespace {

using megaplan::DType;
using megaplan::exec::dropout_site;
using megaplan::exec::DropoutKind;
using megaplan::exec::DropoutMask;
using megaplan::test::relative_error;

struct Case {
  int64_t batch, seq, heads, kv_heads, dim;
};

// Megatron's packed qkv of a case: per token, each key-value head's group query heads, its key
// and its value, head_dim values each.
struct Packed {
  int64_t group, head_stride, token_stride;
  explicit Packed(const Case& c)
      : group(c.heads / c.kv_heads), head_stride((group + 2) * c.dim), token_stride(c.kv_heads * head_stride) {}
  int64_t query(const Case& c, int64_t b, int64_t t, int64_t h) const {
    return (b * c.seq + t) * token_stride + (h / group) * head_stride + (h % group) * c.dim;
  }
  int64_t key(const Case& c, int64_t b, int64_t t, int64_t g) const {
    return (b * c.seq + t) * token_stride + g * head_stride + group * c.dim;
  }
  int64_t value(const Case& c, int64_t b, int64_t t, int64_t g) const { return key(c, b, t, g) + c.dim; }
  // 0, 1, 2: whether packed element i is a query's, a key's or a value's.
  int part(const Case& c, std::size_t i) const {
    const int64_t offset = static_cast<int64_t>(i) % head_stride;
    return offset < group * c.dim ? 0 : offset < (group + 1) * c.dim ? 1 : 2;
  }
};

double softmax_scale(const Case& c) { return 1.0 / std::sqrt(static_cast<double>(c.dim)); }

struct Outputs {
  std::vector<double> out, lse, dqkv;
};

// Softmax rows, P ∘ Z / (1 - p), outputs, log-sum-exp, and the gradients into a packed dqkv, with
// Z drawn from the mask's definition (all ones when it is inactive).
Outputs reference(const Case& c, const std::vector<float>& qkv, const std::vector<float>& dout,
                  const DropoutMask& mask) {
  const Packed packed(c);
  const int64_t d = c.dim;
  const double scale = softmax_scale(c), keep_scale = mask.active() ? mask.scale() : 1.0;
  const auto at = [&](int64_t index) { return static_cast<double>(qkv[static_cast<std::size_t>(index)]); };
  Outputs want{std::vector<double>(dout.size()),
               std::vector<double>(static_cast<std::size_t>(c.batch * c.heads * c.seq)),
               std::vector<double>(qkv.size(), 0.0)};
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.heads; ++h) {
      const int64_t g = h / packed.group;
      for (int64_t i = 0; i < c.seq; ++i) {
        const auto keys = static_cast<std::size_t>(i + 1);
        std::vector<double> p(keys), kept(keys), dropped(keys), dp(keys);  // P, Z / (1 - p), P ∘ that, dO V^T
        double row_max = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          double s = 0;
          for (int64_t e = 0; e < d; ++e) s += at(packed.query(c, b, i, h) + e) * at(packed.key(c, b, j, g) + e);
          p[static_cast<std::size_t>(j)] = s * scale;
          row_max = std::max(row_max, s * scale);
        }
        double sum = 0;
        for (double& value : p) sum += (value = std::exp(value - row_max));
        for (double& value : p) value /= sum;
        for (int64_t j = 0; j <= i; ++j) {
          const auto js = static_cast<std::size_t>(j);
          kept[js] = !mask.active() || mask.keeps_probability(b, h, i, j) ? keep_scale : 0.0;
          dropped[js] = p[js] * kept[js];
        }
        want.lse[static_cast<std::size_t>((b * c.heads + h) * c.seq + i)] = row_max + std::log(sum);
        const auto o_row = static_cast<std::size_t>(((b * c.seq + i) * c.heads + h) * d);
        for (int64_t e = 0; e < d; ++e) {
          double o = 0;
          for (int64_t j = 0; j <= i; ++j) o += dropped[static_cast<std::size_t>(j)] * at(packed.value(c, b, j, g) + e);
          want.out[o_row + static_cast<std::size_t>(e)] = o;
        }
        double row_dot = 0;  // rowsum(dO ∘ O)
        for (int64_t j = 0; j <= i; ++j) {
          double value = 0;
          for (int64_t e = 0; e < d; ++e)
            value += dout[o_row + static_cast<std::size_t>(e)] * at(packed.value(c, b, j, g) + e);
          dp[static_cast<std::size_t>(j)] = value;
          row_dot += dropped[static_cast<std::size_t>(j)] * value;
        }
        for (int64_t j = 0; j <= i; ++j) {
          const auto js = static_cast<std::size_t>(j);
          const double ds = p[js] * (dp[js] * kept[js] - row_dot);
          const int64_t qi = packed.query(c, b, i, h), kj = packed.key(c, b, j, g), vj = packed.value(c, b, j, g);
          for (int64_t e = 0; e < d; ++e) {
            want.dqkv[static_cast<std::size_t>(qi + e)] += scale * ds * at(kj + e);
            want.dqkv[static_cast<std::size_t>(kj + e)] += scale * ds * at(qi + e);
            want.dqkv[static_cast<std::size_t>(vj + e)] += dropped[js] * dout[o_row + static_cast<std::size_t>(e)];
          }
        }
      }
    }
  }
  return want;
}

struct Results {
  std::vector<float> out, lse, dqkv;
  bool backward_repeats = false;  // a second backward gives the same bits
};

// The forward and the backward on the device, every output poisoned first.
Results run_kernels(const Case& c, const std::vector<float>& qkv, const std::vector<float>& dout,
                    const DropoutMask& mask, DType precision, cudaStream_t stream) {
  const Packed packed(c);
  const int64_t d = c.dim, group = packed.group;
  const auto lse_size = static_cast<std::size_t>(c.batch * c.heads * c.seq);
  cu::Half* qkv_device = cu::upload_half(qkv, precision, stream);
  cu::Half* dout_device = cu::upload_half(dout, precision, stream);
  cu::Half* out = cu::upload_half(std::vector<float>(dout.size(), 1e30f), precision, stream);
  float* lse = cu::upload_floats(std::vector<float>(lse_size, NAN), stream);
  cu::Half* dqkv = cu::upload_half(std::vector<float>(qkv.size(), 1e30f), precision, stream);
  cu::AttentionShape shape{c.batch,
                           c.seq,
                           c.heads,
                           c.kv_heads,
                           d,
                           packed.token_stride,
                           packed.head_stride,
                           static_cast<float>(softmax_scale(c))};
  shape.dropout = mask;
  const cu::Half *q = qkv_device, *k = qkv_device + group * d, *v = qkv_device + (group + 1) * d;
  cu::flash_attention_forward(shape, q, k, v, out, lse, precision, stream);
  float* workspace =
      cu::upload_floats(std::vector<float>(cu::flash_attention_backward_workspace_bytes(shape) / 4), stream);
  Results results;
  for (int run = 0; run < 2; ++run) {
    cu::flash_attention_backward(shape, dout_device, q, k, v, out, lse, packed.token_stride, dqkv, dqkv + group * d,
                                 dqkv + (group + 1) * d, workspace, precision, stream);
    std::vector<float> gradients = cu::download_half(dqkv, qkv.size(), precision, stream);
    if (run == 0)
      results.dqkv = std::move(gradients);
    else
      results.backward_repeats =
          std::memcmp(results.dqkv.data(), gradients.data(), gradients.size() * sizeof(float)) == 0;
  }
  results.out = cu::download_half(out, dout.size(), precision, stream);
  results.lse = cu::download_floats(lse, lse_size, stream);
  for (void* buffer : {static_cast<void*>(qkv_device), static_cast<void*>(dout_device), static_cast<void*>(out),
                       static_cast<void*>(lse), static_cast<void*>(dqkv), static_cast<void*>(workspace)}) {
    cu::free_device(buffer);
  }
  return results;
}

// P and dS are rounded to the inputs' type before their products, and the outputs once: fp16
// keeps 3 more bits than bf16 (measured on an H200: at most 3.4e-4 in fp16, 2.7e-3 in bf16).
double tolerance(DType precision) { return precision == DType::kFloat16 ? 2e-3 : 1e-2; }

void check_against_reference(const Case& c, const Results& got, const Outputs& want, DType precision) {
  CHECK(relative_error(got.out, want.out) < tolerance(precision));
  CHECK(relative_error(got.lse, want.lse) < 1e-3);
  // dq, dk and dv separately.
  const Packed packed(c);
  for (int part = 0; part < 3; ++part) {
    INFO((part == 0 ? "dq" : part == 1 ? "dk" : "dv"));
    std::vector<float> got_part;
    std::vector<double> want_part;
    for (std::size_t i = 0; i < got.dqkv.size(); ++i) {
      if (packed.part(c, i) != part) continue;
      got_part.push_back(got.dqkv[i]);
      want_part.push_back(want.dqkv[i]);
    }
    // ||got - want|| / ||want||; the absolute norm of the difference where want is all zeros (a
    // one-token sequence has zero dq and dk: its softmax is constant).
    CHECK(relative_error(got_part, want_part) < tolerance(precision));
  }
  CHECK(got.backward_repeats);  // deterministic
}

std::vector<float> rounded_normal(std::size_t n, DType precision, std::mt19937& generator, float sigma = 1.0f) {
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> values(n);
  for (float& value : values) value = cu::from_half(cu::to_half(normal(generator), precision), precision);
  return values;
}

DropoutMask attention_mask(const Case& c, float probability, int64_t first_head) {
  DropoutMask mask;
  mask.probability = probability;
  mask.seed = 0xfeedfacecafebeefull;
  mask.site = dropout_site(3, DropoutKind::kAttentionProbabilities);
  mask.first_sample = 21;
  mask.seq = c.seq;
  mask.first_head = first_head;
  return mask;
}

}  // namespace

TEST_CASE("flash attention matches a double-precision reference drawing the same mask, with and without dropout",
          "[gpu][kernels]") {
  const DType precision = GENERATE(DType::kBFloat16, DType::kFloat16);
  INFO(megaplan::to_string(precision));
  std::mt19937 generator(7);
  const cu::Stream stream;
  // Sequences that are and are not multiples of 4 (runs of keys that start a Philox draw and runs
  // that start mid-draw), grouped queries, a rank whose heads start past the model's first.
  for (const Case c : {Case{2, 37, 3, 3, 64}, Case{1, 200, 4, 2, 128}, Case{2, 1, 2, 2, 64}, Case{1, 130, 2, 2, 128},
                       Case{1, 64, 4, 1, 64}, Case{2, 64, 4, 1, 64}}) {
    INFO("batch " << c.batch << ", seq " << c.seq << ", heads " << c.heads << ", kv heads " << c.kv_heads << ", dim "
                  << c.dim);
    const Packed packed(c);
    const std::vector<float> qkv =
        rounded_normal(static_cast<std::size_t>(c.batch * c.seq * packed.token_stride), precision, generator);
    const std::vector<float> dout =
        rounded_normal(static_cast<std::size_t>(c.batch * c.seq * c.heads * c.dim), precision, generator);
    const Results plain = run_kernels(c, qkv, dout, DropoutMask{}, precision, stream);
    check_against_reference(c, plain, reference(c, qkv, dout, DropoutMask{}), precision);
    // p = 0 draws nothing: the kernels without dropout, bit for bit.
    const Results zero = run_kernels(c, qkv, dout, attention_mask(c, 0.0f, c.heads), precision, stream);
    CHECK(std::memcmp(plain.out.data(), zero.out.data(), plain.out.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(plain.lse.data(), zero.lse.data(), plain.lse.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(plain.dqkv.data(), zero.dqkv.data(), plain.dqkv.size() * sizeof(float)) == 0);
    // One token: dQ and dK are 0 in exact arithmetic (the softmax of one score), and with a kept
    // probability scaled by 1 / (1 - p) what remains is rounding, which no relative error measures.
    if (c.seq == 1) continue;
    const DropoutMask mask = attention_mask(c, 0.1f, c.heads);
    check_against_reference(c, run_kernels(c, qkv, dout, mask, precision, stream), reference(c, qkv, dout, mask),
                            precision);
  }
}

TEST_CASE("flash attention drops exactly the mask's probabilities, forward and dV", "[gpu][kernels]") {
  const DType precision = GENERATE(DType::kBFloat16, DType::kFloat16);
  INFO(megaplan::to_string(precision));
  std::mt19937 generator(13);
  const cu::Stream stream;
  // V one-hot (token j's value is unit vector j, so seq <= dim) makes out[i][e] = P_ie Z_ie / (1 - p):
  // zero exactly where the mask drops (or e > i). dO one-hot on one query head h_sel alike makes
  // dV[j][i] of its key-value head that head's P_ij Z_ij / (1 - p). Small scores keep every P
  // far from underflow.
  for (const Case c : {Case{1, 61, 2, 1, 64}, Case{2, 64, 4, 2, 64}, Case{1, 128, 2, 2, 128}, Case{1, 99, 3, 3, 128}}) {
    INFO("batch " << c.batch << ", seq " << c.seq << ", heads " << c.heads << ", kv heads " << c.kv_heads << ", dim "
                  << c.dim);
    const Packed packed(c);
    const int64_t d = c.dim, h_sel = c.heads - 1, g_sel = h_sel / packed.group;
    std::vector<float> qkv =
        rounded_normal(static_cast<std::size_t>(c.batch * c.seq * packed.token_stride), precision, generator, 0.3f);
    std::vector<float> dout(static_cast<std::size_t>(c.batch * c.seq * c.heads * d), 0.0f);
    for (int64_t b = 0; b < c.batch; ++b) {
      for (int64_t t = 0; t < c.seq; ++t) {
        for (int64_t g = 0; g < c.kv_heads; ++g) {
          for (int64_t e = 0; e < d; ++e)
            qkv[static_cast<std::size_t>(packed.value(c, b, t, g) + e)] = e == t ? 1.0f : 0.0f;
        }
        dout[static_cast<std::size_t>(((b * c.seq + t) * c.heads + h_sel) * d + t)] = 1.0f;
      }
    }
    const DropoutMask mask = attention_mask(c, 0.3f, 2);
    const Results got = run_kernels(c, qkv, dout, mask, precision, stream);
    int64_t wrong_out = 0, wrong_dv = 0, dropped = 0;
    for (int64_t b = 0; b < c.batch; ++b) {
      for (int64_t i = 0; i < c.seq; ++i) {
        for (int64_t h = 0; h < c.heads; ++h) {
          for (int64_t e = 0; e < d; ++e) {
            const bool want_nonzero = e <= i && mask.keeps_probability(b, h, i, e);
            const float value = got.out[static_cast<std::size_t>(((b * c.seq + i) * c.heads + h) * d + e)];
            wrong_out += (value != 0.0f) != want_nonzero;
            dropped += e <= i && !want_nonzero;
          }
        }
        // dV of token i, element e: query e's probability of key i in head h_sel.
        for (int64_t g = 0; g < c.kv_heads; ++g) {
          for (int64_t e = 0; e < d; ++e) {
            const bool want_nonzero = g == g_sel && i <= e && e < c.seq && mask.keeps_probability(b, h_sel, e, i);
            const float value = got.dqkv[static_cast<std::size_t>(packed.value(c, b, i, g) + e)];
            wrong_dv += (value != 0.0f) != want_nonzero;
          }
        }
      }
    }
    CHECK(dropped > 0);
    CHECK(wrong_out == 0);
    CHECK(wrong_dv == 0);
  }
}

TEST_CASE("flash attention refuses head dimensions it has no kernel for", "[gpu][kernels]") {
  const cu::AttentionShape shape{1, 8, 2, 2, 80, 480, 240, 0.1f};
  const cu::Stream stream;
  for (const DType precision : {DType::kBFloat16, DType::kFloat16}) {
    CHECK_THROWS_WITH(
        cu::flash_attention_forward(shape, nullptr, nullptr, nullptr, nullptr, nullptr, precision, stream),
        Catch::Contains("head dimensions 64 and 128, got 80"));
  }
}
