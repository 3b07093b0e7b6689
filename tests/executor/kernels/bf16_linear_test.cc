// cuBLASLt linear layers with fused epilogues, in bf16 and in fp16, against a double-precision
// reference computed from the same rounded inputs, on fresh random shapes and values.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "core/implementation_options.h"
#include "executor/kernels/cuda/bf16_linear.h"
#include "executor/kernels/cuda/stream.h"
#include "tests/executor/kernels/relative_error.h"

namespace cu = megaplan::exec::cuda;

namespace {

using megaplan::test::relative_error;

using megaplan::DType;

std::vector<float> half_values(std::size_t n, DType precision, std::mt19937& generator) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(n);
  for (float& value : values) value = cu::from_half(cu::to_half(normal(generator), precision), precision);
  return values;
}

double gelu(double v) { return 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))); }

}  // namespace

TEST_CASE("linear layers with fused bias, GELU, GELU-gradient and bias-gradient epilogues", "[gpu][kernels]") {
  const DType precision = GENERATE(DType::kBFloat16, DType::kFloat16);
  INFO(megaplan::to_string(precision));
  // The 16-bit outputs' rounding dominates (fp32 accumulation): up to 2^-8 relative in bf16, 2^-11 in fp16.
  const double tolerance = precision == DType::kFloat16 ? 2e-3 : 1e-2;
  std::mt19937 generator(29);
  const cu::Stream stream;
  cu::Bf16Linear linear;
  linear.set_fp16(precision == DType::kFloat16);
  const auto upload = [&](const std::vector<float>& host) { return cu::upload_half(host, precision, stream); };
  const auto download = [&](const cu::Half* device, std::size_t n) {
    return cu::download_half(device, n, precision, stream);
  };
  for (auto [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{64, 96, 128}, {128, 64, 256}, {24, 40, 56}}) {
    const auto mz = static_cast<std::size_t>(m), kz = static_cast<std::size_t>(k), nz = static_cast<std::size_t>(n);
    const std::vector<float> x = half_values(mz * kz, precision, generator),
                             w = half_values(nz * kz, precision, generator), b = half_values(nz, precision, generator),
                             dy = half_values(mz * nz, precision, generator);
    std::vector<double> pre(mz * nz);
    for (std::size_t i = 0; i < mz; ++i) {
      for (std::size_t j = 0; j < nz; ++j) {
        double sum = b[j];
        for (std::size_t p = 0; p < kz; ++p) sum += static_cast<double>(x[i * kz + p]) * w[j * kz + p];
        pre[i * nz + j] = sum;
      }
    }
    std::vector<double> activated(pre.size());
    for (std::size_t i = 0; i < pre.size(); ++i) activated[i] = gelu(pre[i]);
    cu::Half* dx_ = upload(x);
    cu::Half* dw_ = upload(w);
    cu::Half* db_ = upload(b);
    cu::Half* ddy = upload(dy);
    cu::Half* y = upload(std::vector<float>(mz * nz, 1e30f));    // poisoned
    cu::Half* aux = upload(std::vector<float>(mz * nz, 1e30f));  // poisoned
    INFO("m " << m << ", k " << k << ", n " << n);

    linear.forward(dx_, dw_, db_, m, k, n, megaplan::GemmEpilogue::kBias, y, nullptr, stream);
    CHECK(relative_error(download(y, mz * nz), pre) < tolerance);
    linear.forward(dx_, dw_, db_, m, k, n, megaplan::GemmEpilogue::kBiasGelu, y, aux, stream);
    CHECK(relative_error(download(y, mz * nz), activated) < tolerance);
    CHECK(relative_error(download(aux, mz * nz), pre) < tolerance);

    std::vector<double> want_dx(mz * kz, 0.0), want_dw(nz * kz, 0.0), want_db(nz, 0.0);
    const std::vector<float> dw_start = half_values(nz * kz, precision, generator);
    for (std::size_t i = 0; i < mz; ++i) {
      for (std::size_t j = 0; j < nz; ++j) {
        const double g = dy[i * nz + j];
        want_db[j] += g;
        for (std::size_t p = 0; p < kz; ++p) {
          want_dx[i * kz + p] += g * w[j * kz + p];
          want_dw[j * kz + p] += g * x[i * kz + p];
        }
      }
    }
    for (std::size_t i = 0; i < want_dw.size(); ++i) want_dw[i] += dw_start[i];  // accumulates
    cu::Half* dx = upload(std::vector<float>(mz * kz, 1e30f));
    float* dw = cu::upload_floats(dw_start, stream);
    float* dbias = cu::upload_floats(std::vector<float>(nz, 1e30f), stream);
    linear.backward(ddy, dx_, dw_, m, k, n, dx, dw, dbias, stream);
    CHECK(relative_error(download(dx, mz * kz), want_dx) < tolerance);
    CHECK(relative_error(cu::download_floats(dw, nz * kz, stream), want_dw) < 1e-3);
    CHECK(relative_error(cu::download_floats(dbias, nz, stream), want_db) < 1e-3);

    // Through a GELU: d_pre = (dy W) * GELU'(pre).
    const std::vector<float> pre_values = half_values(mz * kz, precision, generator);
    std::vector<double> want_d_pre(mz * kz);
    for (std::size_t i = 0; i < mz * kz; ++i) {
      const double v = pre_values[i], e = 1e-4;
      want_d_pre[i] = want_dx[i] * (gelu(v + e) - gelu(v - e)) / (2 * e);
    }
    cu::Half* pre_device = upload(pre_values);
    cu::Half* d_pre = upload(std::vector<float>(mz * kz, 1e30f));
    linear.backward_data_through_gelu(ddy, dw_, m, k, n, pre_device, d_pre, stream);
    CHECK(relative_error(download(d_pre, mz * kz), want_d_pre) < tolerance);
    cu::free_device(pre_device);
    cu::free_device(d_pre);
    for (void* buffer : {static_cast<void*>(dx_), static_cast<void*>(dw_), static_cast<void*>(db_),
                         static_cast<void*>(ddy), static_cast<void*>(y), static_cast<void*>(aux),
                         static_cast<void*>(dx), static_cast<void*>(dw), static_cast<void*>(dbias)}) {
      cu::free_device(buffer);
    }
  }
}
