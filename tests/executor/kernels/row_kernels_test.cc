// The row and element-wise CUDA kernels (norms, embedding, GELU/SwiGLU/RoPE, residual adds, casts),
// in bf16 and in fp16, against the CPU references run on the same rounded inputs: fresh random
// inputs, poisoned outputs, odd shapes (rows 1 and 37, columns not a multiple of 8), fp32 weight
// gradients accumulated onto non-zero starting values, and backward passes run twice to check
// that they give the same bits.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/implementation_options.h"
#include "executor/kernels/cuda/bf16_linear.h"
#include "executor/kernels/cuda/elementwise.h"
#include "executor/kernels/cuda/embedding.h"
#include "executor/kernels/cuda/norms.h"
#include "executor/kernels/cuda/stream.h"
#include "executor/kernels/dropout_mask.h"
#include "executor/kernels/reference/dropout.h"
#include "executor/kernels/reference/embedding.h"
#include "executor/kernels/reference/gelu.h"
#include "executor/kernels/reference/layernorm.h"
#include "executor/kernels/reference/rmsnorm.h"
#include "executor/kernels/reference/rope.h"
#include "executor/kernels/reference/swiglu.h"
#include "tests/executor/kernels/relative_error.h"

namespace cu = megaplan::exec::cuda;
namespace ref = megaplan::exec::reference;

namespace {

using megaplan::DType;
using megaplan::exec::DropoutMask;

constexpr float kPoison = 1e30f;  // beyond fp16's range: uploads as infinity there
constexpr float kEps = 1e-5f;

// The 16-bit results against fp32 references on the same inputs: their rounding (up to 2^-8
// relative in bf16, 2^-11 in fp16) dominates.
double tolerance(DType precision) { return precision == DType::kFloat16 ? 2e-3 : 1e-2; }

float round_to(DType precision, float value) { return cu::from_half(cu::to_half(value, precision), precision); }

std::vector<float> half_values(std::size_t n, DType precision, std::mt19937& generator, float mean = 0.0f,
                               float scale = 1.0f) {
  std::normal_distribution<float> normal(mean, scale);
  std::vector<float> values(n);
  for (float& value : values) value = round_to(precision, normal(generator));
  return values;
}

std::vector<float> float_values(std::size_t n, std::mt19937& generator) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(n);
  for (float& value : values) value = normal(generator);
  return values;
}

std::vector<float> rounded(std::vector<float> values, DType precision) {
  for (float& value : values) value = round_to(precision, value);
  return values;
}

// The shared relative error, infinite also where poison was left unwritten (as infinity in fp16).
double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  for (const float value : got) {
    if (!(std::abs(value) < kPoison / 2)) return INFINITY;
  }
  return megaplan::test::relative_error(got, want);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Device buffers filled on `stream`, freed at scope exit; 16-bit ones of `precision`.
class Buffers {
 public:
  Buffers(cudaStream_t stream, DType precision) : stream_(stream), precision_(precision) {}
  ~Buffers() {
    for (void* p : owned_) cu::free_device(p);
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  cu::Half* half(const std::vector<float>& host) { return keep(cu::upload_half(host, precision_, stream_)); }
  cu::Half* half_poisoned(std::size_t n) { return half(std::vector<float>(n, kPoison)); }
  std::vector<float> download(const cu::Half* device, std::size_t n) {
    return cu::download_half(device, n, precision_, stream_);
  }
  float* floats(const std::vector<float>& host) { return keep(cu::upload_floats(host, stream_)); }
  float* floats_poisoned(std::size_t n) { return floats(std::vector<float>(n, kPoison)); }
  int32_t* ints(const std::vector<int32_t>& host) {
    std::vector<float> bits(host.size());
    std::memcpy(bits.data(), host.data(), host.size() * sizeof(int32_t));
    return reinterpret_cast<int32_t*>(floats(bits));  // upload_floats copies bytes: the same 4 per value
  }
  void* bytes(std::size_t n) { return floats(std::vector<float>((n + 3) / 4 + 1, 0.0f)); }

 private:
  template <typename T>
  T* keep(T* p) {
    owned_.push_back(p);
    return p;
  }
  cudaStream_t stream_;
  DType precision_;
  std::vector<void*> owned_;
};

std::vector<float> add_rounded(const std::vector<float>& a, const std::vector<float>& b, DType precision) {
  std::vector<float> sum(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) sum[i] = round_to(precision, a[i] + b[i]);
  return sum;
}

// The norm's fused residual: as it is, or (Megatron's bias-dropout-add fused into the norm) through
// a mask whose rows start mid-sequence, as a sequence-parallel rank's do.
enum class Residual { kNone, kAdded, kDropped };
DropoutMask branch_mask(Residual residual) {
  DropoutMask mask;
  if (residual != Residual::kDropped) return mask;
  mask.probability = 0.25f;
  mask.seed = 77;
  mask.site = megaplan::exec::dropout_site(3, megaplan::exec::DropoutKind::kAttentionBranch);
  mask.first_sample = 12;
  mask.seq = 16;
  mask.first_row = 5;
  return mask;
}
// The rounded sum the norm reads: x + dropout(residual) in fp32, rounded once.
std::vector<float> norm_input(const std::vector<float>& x, const std::vector<float>& residual, Residual kind,
                              int64_t rows, int64_t cols, DType precision) {
  if (kind == Residual::kNone) return x;
  std::vector<float> dropped(residual.size());
  ref::dropout(residual.data(), nullptr, static_cast<std::size_t>(rows), static_cast<std::size_t>(cols),
               branch_mask(kind), dropped.data());
  return add_rounded(x, dropped, precision);
}

const std::vector<std::pair<int64_t, int64_t>> kNormShapes = {{37, 200},   {1, 1000},  {64, 1024}, {37, 999},
                                                              {300, 2048}, {5, 12288}, {2, 32768}};

}  // namespace

TEST_CASE("LayerNorm forward and backward, with and without the fused residual and its dropout", "[gpu][kernels]") {
  const DType precision = GENERATE(DType::kBFloat16, DType::kFloat16);
  INFO(megaplan::to_string(precision));
  std::mt19937 generator(101);
  const cu::Stream stream;
  for (auto [rows, cols] : kNormShapes) {
    for (const Residual kind : {Residual::kNone, Residual::kAdded, Residual::kDropped}) {
      const bool fused = kind != Residual::kNone;
      INFO("rows " << rows << ", cols " << cols << (fused ? ", residual fused" : "")
                   << (kind == Residual::kDropped ? " through dropout" : ""));
      const auto r = static_cast<std::size_t>(rows), c = static_cast<std::size_t>(cols), n = r * c;
      Buffers device(stream, precision);
      const std::vector<float> x = half_values(n, precision, generator, 0.5f, 2.0f),
                               residual = half_values(n, precision, generator);
      const std::vector<float> gamma = half_values(c, precision, generator, 1.0f, 0.5f),
                               beta = half_values(c, precision, generator);
      const std::vector<float> input = norm_input(x, residual, kind, rows, cols, precision);
      std::vector<float> want_y(n), want_mean(r), want_rstd(r);
      ref::layernorm_forward(input.data(), gamma.data(), beta.data(), r, c, kEps, want_y.data(), want_mean.data(),
                             want_rstd.data());
      cu::Half* d_x = device.half(x);
      cu::Half* d_sum = fused ? device.half_poisoned(n) : nullptr;
      cu::Half* d_y = device.half_poisoned(n);
      float* d_mean = device.floats_poisoned(r);
      float* d_rstd = device.floats_poisoned(r);
      cu::layernorm_forward(d_x, fused ? device.half(residual) : nullptr, branch_mask(kind), d_sum, device.half(gamma),
                            device.half(beta), rows, cols, kEps, d_y, d_mean, d_rstd, precision, stream);
      if (fused) CHECK(same_bits(device.download(d_sum, n), input));
      CHECK(relative_error(device.download(d_y, n), want_y) < tolerance(precision));
      // fp32 statistics of the same (rounded) values: far tighter than the 16-bit outputs.
      CHECK(relative_error(cu::download_floats(d_mean, r, stream), want_mean) < 1e-5);
      CHECK(relative_error(cu::download_floats(d_rstd, r, stream), want_rstd) < 1e-5);

      const std::vector<float> dy = half_values(n, precision, generator), around = half_values(n, precision, generator);
      const std::vector<float> dgamma_start = float_values(c, generator), dbeta_start = float_values(c, generator);
      std::vector<float> want_dx(n), want_dgamma = dgamma_start, want_dbeta = dbeta_start;
      ref::layernorm_backward(dy.data(), input.data(), gamma.data(), want_mean.data(), want_rstd.data(), r, c,
                              want_dx.data(), want_dgamma.data(), want_dbeta.data());
      if (fused) {
        for (std::size_t i = 0; i < n; ++i) want_dx[i] += around[i];
      }
      cu::Half* d_input = fused ? d_sum : d_x;
      cu::Half* d_dy = device.half(dy);
      cu::Half* d_around = fused ? device.half(around) : nullptr;
      void* workspace = device.bytes(cu::norm_backward_workspace_bytes(rows, cols));
      std::vector<float> first_dx, first_dgamma, first_dbeta;
      for (int run = 0; run < 2; ++run) {
        cu::Half* d_dx = device.half_poisoned(n);
        float* d_dgamma = device.floats(dgamma_start);
        float* d_dbeta = device.floats(dbeta_start);
        cu::layernorm_backward(d_dy, d_input, device.half(gamma), d_mean, d_rstd, rows, cols, d_around, d_dx, d_dgamma,
                               d_dbeta, workspace, precision, stream);
        const std::vector<float> dx = device.download(d_dx, n), dgamma = cu::download_floats(d_dgamma, c, stream),
                                 dbeta = cu::download_floats(d_dbeta, c, stream);
        if (run == 0) {
          CHECK(relative_error(dx, want_dx) < tolerance(precision));
          CHECK(relative_error(dgamma, want_dgamma) < 1e-3);
          CHECK(relative_error(dbeta, want_dbeta) < 1e-3);
          first_dx = dx, first_dgamma = dgamma, first_dbeta = dbeta;
        } else {
          CHECK(same_bits(dx, first_dx));
          CHECK(same_bits(dgamma, first_dgamma));
          CHECK(same_bits(dbeta, first_dbeta));
        }
      }
    }
  }
}

TEST_CASE("RMSNorm forward and backward, with and without the fused residual and its dropout", "[gpu][kernels]") {
  const DType precision = GENERATE(DType::kBFloat16, DType::kFloat16);
  INFO(megaplan::to_string(precision));
  std::mt19937 generator(103);
  const cu::Stream stream;
  for (auto [rows, cols] : kNormShapes) {
    for (const Residual kind : {Residual::kNone, Residual::kAdded, Residual::kDropped}) {
      const bool fused = kind != Residual::kNone;
      INFO("rows " << rows << ", cols " << cols << (fused ? ", residual fused" : "")
                   << (kind == Residual::kDropped ? " through dropout" : ""));
      const auto r = static_cast<std::size_t>(rows), c = static_cast<std::size_t>(cols), n = r * c;
      Buffers device(stream, precision);
      const std::vector<float> x = half_values(n, precision, generator, 0.5f, 2.0f),
                               residual = half_values(n, precision, generator);
      const std::vector<float> gamma = half_values(c, precision, generator, 1.0f, 0.5f);
      const std::vector<float> input = norm_input(x, residual, kind, rows, cols, precision);
      std::vector<float> want_y(n), want_rstd(r);
      ref::rmsnorm_forward(input.data(), gamma.data(), r, c, kEps, want_y.data(), want_rstd.data());
      cu::Half* d_x = device.half(x);
      cu::Half* d_sum = fused ? device.half_poisoned(n) : nullptr;
      cu::Half* d_y = device.half_poisoned(n);
      float* d_rstd = device.floats_poisoned(r);
      cu::rmsnorm_forward(d_x, fused ? device.half(residual) : nullptr, branch_mask(kind), d_sum, device.half(gamma),
                          rows, cols, kEps, d_y, d_rstd, precision, stream);
      if (fused) CHECK(same_bits(device.download(d_sum, n), input));
      CHECK(relative_error(device.download(d_y, n), want_y) < tolerance(precision));
      CHECK(relative_error(cu::download_floats(d_rstd, r, stream), want_rstd) < 1e-5);

      const std::vector<float> dy = half_values(n, precision, generator), around = half_values(n, precision, generator);
      const std::vector<float> dgamma_start = float_values(c, generator);
      std::vector<float> want_dx(n), want_dgamma = dgamma_start;
      ref::rmsnorm_backward(dy.data(), input.data(), gamma.data(), want_rstd.data(), r, c, want_dx.data(),
                            want_dgamma.data());
      if (fused) {
        for (std::size_t i = 0; i < n; ++i) want_dx[i] += around[i];
      }
      cu::Half* d_input = fused ? d_sum : d_x;
      cu::Half* d_dy = device.half(dy);
      cu::Half* d_around = fused ? device.half(around) : nullptr;
      void* workspace = device.bytes(cu::norm_backward_workspace_bytes(rows, cols));
      std::vector<float> first_dx, first_dgamma;
      for (int run = 0; run < 2; ++run) {
        // The second run writes dx over the residual gradient it adds (in place, as the trainer may).
        cu::Half* d_dx = run == 1 && fused ? device.half(around) : device.half_poisoned(n);
        float* d_dgamma = device.floats(dgamma_start);
        cu::rmsnorm_backward(d_dy, d_input, device.half(gamma), d_rstd, rows, cols, run == 1 && fused ? d_dx : d_around,
                             d_dx, d_dgamma, workspace, precision, stream);
        const std::vector<float> dx = device.download(d_dx, n), dgamma = cu::download_floats(d_dgamma, c, stream);
        if (run == 0) {
          CHECK(relative_error(dx, want_dx) < tolerance(precision));
          CHECK(relative_error(dgamma, want_dgamma) < 1e-3);
          first_dx = dx, first_dgamma = dgamma;
        } else {
          CHECK(same_bits(dx, first_dx));
          CHECK(same_bits(dgamma, first_dgamma));
        }
      }
    }
  }
}

TEST_CASE("the query and key norms on a fused qkv, forward and backward in place", "[gpu][kernels]") {
  // Qwen3's heads (128; Qwen3-30B-A3B's 8 query heads a group at tp 4) and small ones (64, MHA), a
  // value head passed through bit for bit; the same bits from a second run.
  const DType precision = GENERATE(DType::kBFloat16, DType::kFloat16);
  INFO(megaplan::to_string(precision));
  std::mt19937 generator(211);
  const cu::Stream stream;
  for (const auto& [query_groups, group, dim] :
       {std::tuple<int64_t, int64_t, int64_t>{4096, 8, 128}, {37, 1, 64}, {300, 2, 128}}) {
    INFO("query groups " << query_groups << ", group " << group << ", dim " << dim);
    const auto rows = static_cast<std::size_t>(query_groups * (group + 2)), d = static_cast<std::size_t>(dim);
    const std::size_t n = rows * d;
    Buffers device(stream, precision);
    const std::vector<float> qkv = half_values(n, precision, generator, 0.2f, 2.0f);
    const std::vector<float> q_gamma = half_values(d, precision, generator, 1.0f, 0.5f),
                             k_gamma = half_values(d, precision, generator, 1.0f, 0.5f);
    std::vector<float> want_y(n), want_rstd(rows);
    ref::head_rmsnorm_forward(qkv.data(), q_gamma.data(), k_gamma.data(), rows / (group + 2), 1, group, d, 1e-6f,
                              want_y.data(), want_rstd.data());
    cu::Half* d_qkv = device.half(qkv);
    cu::Half* d_y = device.half_poisoned(n);
    float* d_rstd = device.floats_poisoned(rows);
    cu::head_rmsnorm_forward(d_qkv, device.half(q_gamma), device.half(k_gamma), query_groups, group, dim, 1e-6f, d_y,
                             d_rstd, precision, stream);
    const std::vector<float> y = device.download(d_y, n);
    CHECK(relative_error(y, want_y) < tolerance(precision));
    CHECK(relative_error(cu::download_floats(d_rstd, rows, stream), want_rstd) < 1e-5);
    bool values_passed = true;
    for (std::size_t row = group + 1; row < rows; row += group + 2) {
      values_passed = values_passed && std::equal(y.begin() + static_cast<std::ptrdiff_t>(row * d),
                                                  y.begin() + static_cast<std::ptrdiff_t>((row + 1) * d),
                                                  qkv.begin() + static_cast<std::ptrdiff_t>(row * d));
    }
    CHECK(values_passed);

    const std::vector<float> dy = half_values(n, precision, generator);
    const std::vector<float> dq_start = float_values(d, generator), dk_start = float_values(d, generator);
    std::vector<float> want_dx(n), want_dq = dq_start, want_dk = dk_start;
    ref::head_rmsnorm_backward(dy.data(), qkv.data(), q_gamma.data(), k_gamma.data(), want_rstd.data(),
                               rows / (group + 2), 1, group, d, want_dx.data(), want_dq.data(), want_dk.data());
    void* workspace = device.bytes(cu::norm_backward_workspace_bytes(static_cast<int64_t>(rows), dim));
    std::vector<float> first_dx, first_dq;
    for (int run = 0; run < 2; ++run) {
      cu::Half* d_dx = device.half(dy);  // dx over dy, in place
      float* d_dq = device.floats(dq_start);
      float* d_dk = device.floats(dk_start);
      cu::head_rmsnorm_backward(d_dx, d_qkv, device.half(q_gamma), device.half(k_gamma), d_rstd, query_groups, group,
                                dim, d_dx, d_dq, d_dk, workspace, precision, stream);
      const std::vector<float> dx = device.download(d_dx, n), dq = cu::download_floats(d_dq, d, stream);
      if (run == 0) {
        CHECK(relative_error(dx, want_dx) < tolerance(precision));
        CHECK(relative_error(dq, want_dq) < 1e-3);
        CHECK(relative_error(cu::download_floats(d_dk, d, stream), want_dk) < 1e-3);
        first_dx = dx, first_dq = dq;
      } else {
        CHECK(same_bits(dx, first_dx));
        CHECK(same_bits(dq, first_dq));
      }
    }
  }
}

TEST_CASE("norms reject rows wider than they hold in registers", "[gpu][kernels]") {
  const cu::Stream stream;
  CHECK_THROWS_AS(cu::layernorm_forward(nullptr, nullptr, DropoutMask{}, nullptr, nullptr, nullptr, 4, 40000, kEps,
                                        nullptr, nullptr, nullptr, DType::kBFloat16, stream),
                  megaplan::SpecError);
}

TEST_CASE("embeddings: forward, and the deterministic backward into fp32 tables", "[gpu][kernels]") {
  const DType precision = GENERATE(DType::kBFloat16, DType::kFloat16);
  INFO(megaplan::to_string(precision));
  std::mt19937 generator(107);
  const cu::Stream stream;
  for (auto [batch, seq, hidden, vocab] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{4, 37, 200, 50},
                                           {2, 64, 1024, 300},
                                           {3, 5, 77, 7},
                                           {1, 1, 8, 3}}) {
    // The whole table, and a vocabulary-parallel shard of its rows [vocab / 3, vocab / 3 + rows):
    // the tokens outside reach the kernels as -1.
    for (bool sharded : {false, true}) {
      for (bool with_position : {true, false}) {
        const int64_t vocab_start = sharded ? vocab / 3 : 0;
        const int64_t vocab_rows = sharded ? std::max<int64_t>(1, vocab / 2) : vocab;
        INFO("batch " << batch << ", seq " << seq << ", hidden " << hidden << ", vocab " << vocab << ", rows "
                      << vocab_start << " + " << vocab_rows << (with_position ? ", learned positions" : ""));
        const int64_t count = batch * seq;
        const auto n = static_cast<std::size_t>(count), h = static_cast<std::size_t>(hidden),
                   s = static_cast<std::size_t>(seq), v = static_cast<std::size_t>(vocab_rows),
                   start = static_cast<std::size_t>(vocab_start);
        Buffers device(stream, precision);
        std::uniform_int_distribution<int64_t> pick(0, vocab - 1);
        std::vector<int64_t> tokens64(n);
        for (int64_t& token : tokens64) token = pick(generator);
        tokens64[0] = tokens64[n - 1];           // at least one repeat
        std::vector<int32_t> rows_of_tokens(n);  // what the backend uploads: the shard's row or -1
        std::size_t in_shard = 0;
        for (std::size_t t = 0; t < n; ++t) {
          const int64_t row = tokens64[t] - vocab_start;
          rows_of_tokens[t] = row >= 0 && row < vocab_rows ? static_cast<int32_t>(row) : -1;
          in_shard += rows_of_tokens[t] >= 0 ? 1 : 0;
        }
        const std::vector<float> word = half_values(v * h, precision, generator),
                                 position = half_values(s * h, precision, generator);
        std::vector<float> want_y(n * h);
        ref::embedding_forward(tokens64.data(), n, s, word.data(), start, v, with_position ? position.data() : nullptr,
                               h, want_y.data());
        cu::Half* d_y = device.half_poisoned(n * h);
        cu::embedding_forward(device.ints(rows_of_tokens), count, seq, device.half(word),
                              with_position ? device.half(position) : nullptr, hidden, d_y, precision, stream);
        CHECK(relative_error(device.download(d_y, n * h), want_y) < tolerance(precision));

        const std::vector<float> dy = half_values(n * h, precision, generator);
        const std::vector<float> dword_start = float_values(v * h, generator),
                                 dposition_start = float_values(s * h, generator);
        std::vector<float> want_dword = dword_start, want_dposition = dposition_start;
        ref::embedding_backward(dy.data(), tokens64.data(), n, s, h, start, v, want_dword.data(),
                                with_position ? want_dposition.data() : nullptr);
        const cu::TokenRows rows = cu::build_token_rows(rows_of_tokens.data(), count);
        REQUIRE(rows.row_starts.size() == rows.row_ids.size() + 1);
        CHECK(rows.positions.size() == in_shard);  // -1 tokens are left out
        cu::Half* d_dy = device.half(dy);
        int32_t* row_ids = device.ints(rows.row_ids);
        int32_t* row_starts = device.ints(rows.row_starts);
        int32_t* positions = device.ints(rows.positions);
        std::vector<float> first_dword, first_dposition;
        for (int run = 0; run < 2; ++run) {
          float* d_dword = device.floats(dword_start);
          float* d_dposition = with_position ? device.floats(dposition_start) : nullptr;
          cu::embedding_backward(d_dy, row_ids, row_starts, positions, static_cast<int64_t>(rows.row_ids.size()), count,
                                 seq, hidden, d_dword, d_dposition, precision, stream);
          const std::vector<float> dword = cu::download_floats(d_dword, v * h, stream);
          const std::vector<float> dposition =
              with_position ? cu::download_floats(d_dposition, s * h, stream) : std::vector<float>();
          if (run == 0) {
            CHECK(relative_error(dword, want_dword) < 1e-5);
            if (with_position) CHECK(relative_error(dposition, want_dposition) < 1e-5);
            first_dword = dword, first_dposition = dposition;
          } else {
            CHECK(same_bits(dword, first_dword));
            CHECK(same_bits(dposition, first_dposition));
          }
        }
      }
    }
  }
}

TEST_CASE("element-wise kernels: add, GELU's gradient, casts", "[gpu][kernels]") {
  const DType precision = GENERATE(DType::kBFloat16, DType::kFloat16);
  INFO(megaplan::to_string(precision));
  std::mt19937 generator(109);
  const cu::Stream stream;
  for (int64_t count : {int64_t{1}, int64_t{1001}, int64_t{65536}, int64_t{100003}}) {
    INFO("n " << count);
    const auto n = static_cast<std::size_t>(count);
    Buffers device(stream, precision);
    const std::vector<float> a = half_values(n, precision, generator), b = half_values(n, precision, generator);
    cu::Half* d_a = device.half(a);
    cu::Half* d_y = device.half_poisoned(n);
    cu::add(d_a, device.half(b), count, d_y, precision, stream);
    CHECK(same_bits(device.download(d_y, n), add_rounded(a, b, precision)));
    cu::add(d_a, d_a, count, d_a, precision, stream);  // in place
    CHECK(same_bits(device.download(d_a, n), add_rounded(a, a, precision)));

    const std::vector<float> dy = half_values(n, precision, generator),
                             pre = half_values(n, precision, generator, 0.0f, 2.0f);
    std::vector<float> want_dx(n);
    ref::gelu_backward(dy.data(), pre.data(), n, want_dx.data());
    cu::Half* d_dx = device.half_poisoned(n);
    cu::gelu_backward(device.half(dy), device.half(pre), count, d_dx, precision, stream);
    CHECK(relative_error(device.download(d_dx, n), want_dx) < tolerance(precision));

    std::vector<float> values = float_values(n, generator);
    values[0] = 1e6f;  // past fp16's largest value: infinity there, on the device as on the host
    cu::Half* d_rounded = device.half_poisoned(n);
    cu::cast_to_half(device.floats(values), count, d_rounded, precision, stream);
    // The host's round-to-nearest-even.
    CHECK(same_bits(device.download(d_rounded, n), rounded(values, precision)));
    float* d_widened = device.floats_poisoned(n);
    cu::cast_to_float(d_rounded, count, d_widened, precision, stream);
    CHECK(same_bits(cu::download_floats(d_widened, n, stream), rounded(values, precision)));
  }
}

TEST_CASE("SwiGLU forward and backward", "[gpu][kernels]") {
  const DType precision = GENERATE(DType::kBFloat16, DType::kFloat16);
  INFO(megaplan::to_string(precision));
  std::mt19937 generator(113);
  const cu::Stream stream;
  for (auto [rows, width] : {std::pair<int64_t, int64_t>{37, 200}, {1, 1000}, {64, 1024}, {5, 77}}) {
    INFO("rows " << rows << ", width " << width);
    const auto r = static_cast<std::size_t>(rows), w = static_cast<std::size_t>(width);
    Buffers device(stream, precision);
    const std::vector<float> x = half_values(r * 2 * w, precision, generator, 0.0f, 2.0f),
                             dy = half_values(r * w, precision, generator);
    std::vector<float> want_y(r * w), want_dx(r * 2 * w);
    ref::swiglu_forward(x.data(), r, w, want_y.data());
    ref::swiglu_backward(dy.data(), x.data(), r, w, want_dx.data());
    cu::Half* d_x = device.half(x);
    cu::Half* d_y = device.half_poisoned(r * w);
    cu::Half* d_dx = device.half_poisoned(r * 2 * w);
    cu::swiglu_forward(d_x, rows, width, d_y, precision, stream);
    cu::swiglu_backward(device.half(dy), d_x, rows, width, d_dx, precision, stream);
    CHECK(relative_error(device.download(d_y, r * w), want_y) < tolerance(precision));
    CHECK(relative_error(device.download(d_dx, r * 2 * w), want_dx) < tolerance(precision));
  }
}

TEST_CASE("rotary embeddings in place, and their inverse", "[gpu][kernels]") {
  const DType precision = GENERATE(DType::kBFloat16, DType::kFloat16);
  INFO(megaplan::to_string(precision));
  std::mt19937 generator(127);
  const cu::Stream stream;
  // batch, seq, heads, head_dim, token_stride, rotary_dim: the last is a fused QKV row whose first
  // `heads` heads (the queries) rotate; the third rotates half of each head; the fourth is unaligned.
  for (auto [batch, seq, heads, head_dim, token_stride, rotary_dim] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>{2, 37, 4, 64, 256, 64},
        {1, 300, 2, 128, 768, 128},
        {3, 16, 3, 64, 192, 32},
        {2, 9, 3, 20, 61, 12}}) {
    INFO("batch " << batch << ", seq " << seq << ", heads " << heads << ", head_dim " << head_dim << ", stride "
                  << token_stride << ", rotary_dim " << rotary_dim);
    const auto n = static_cast<std::size_t>(batch * seq * token_stride);
    Buffers device(stream, precision);
    const std::vector<float> x = half_values(n, precision, generator);
    std::vector<float> want = x;
    ref::rope_apply(want.data(), batch, seq, heads, head_dim, token_stride, rotary_dim, 10000.0, false);
    cu::Half* d_x = device.half(x);
    cu::rope_apply(d_x, batch, seq, 1, heads, head_dim, token_stride, heads * head_dim, rotary_dim, 10000.0f, false,
                   precision, stream);
    const std::vector<float> got = device.download(d_x, n);
    CHECK(relative_error(got, want) < tolerance(precision));
    // Values outside the rotated heads and dims are untouched, bit for bit.
    bool untouched = true;
    for (std::size_t i = 0; i < n; ++i) {
      const auto within_token = static_cast<int64_t>(i) % token_stride;
      const bool rotated = within_token < heads * head_dim && within_token % head_dim < rotary_dim;
      if (!rotated && got[i] != x[i]) untouched = false;
    }
    CHECK(untouched);
    cu::rope_apply(d_x, batch, seq, 1, heads, head_dim, token_stride, heads * head_dim, rotary_dim, 10000.0f, true,
                   precision, stream);
    CHECK(relative_error(device.download(d_x, n), x) < tolerance(precision));
  }
}
