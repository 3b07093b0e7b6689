// Achieved memory bandwidth of the bf16 row kernels (LayerNorm and RMSNorm forward and backward,
// the residual add) on rows x cols activations, against a device-to-device copy, the ceiling.
// Bytes counted: each activation read once and each written once (weights and statistics left
// out). Times are medians of device-event timings after a warm-up, all on one non-blocking stream,
// as the backend issues them.
// Build (from the repository root), one line:
//   nvcc -std=c++20 -O3 -gencode=arch=compute_90,code=sm_90 -I. bench/row_kernels_bench.cu
//     executor/kernels/cuda/{norms,elementwise,bf16_linear}.cu executor/comm/comm.cc -lcublasLt -lcublas
//     -o row_kernels_bench
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "executor/kernels/cuda/bf16_linear.h"
#include "executor/kernels/cuda/elementwise.h"
#include "executor/kernels/cuda/norms.h"
#include "executor/kernels/cuda/stream.h"

namespace cu = megaplan::exec::cuda;
constexpr megaplan::DType kBf16 = megaplan::DType::kBFloat16;
const megaplan::exec::DropoutMask kNoDropout;  // the norm's residual added as it is

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

double median_ms(cudaStream_t stream, const std::function<void()>& body) {
  for (int i = 0; i < 5; ++i) body();
  check(cudaStreamSynchronize(stream), "warm-up");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  std::vector<double> times;
  for (int i = 0; i < 30; ++i) {
    check(cudaEventRecord(start, stream), "record");
    body();
    check(cudaEventRecord(stop, stream), "record");
    check(cudaEventSynchronize(stop), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

std::vector<float> random_values(std::size_t n, std::mt19937& generator) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(n);
  for (float& v : values) v = normal(generator);
  return values;
}

void row(const char* name, int64_t rows, int64_t cols, double bytes_per_value, double ms) {
  const double gbps = bytes_per_value * static_cast<double>(rows * cols) / (ms * 1e-3) / 1e9;
  std::printf("%-28s %6lld %6lld %10.1f %10.0f\n", name, static_cast<long long>(rows), static_cast<long long>(cols),
              ms * 1e3, gbps);
}

}  // namespace

int main() {
  std::mt19937 generator(1);
  const cu::Stream stream;
  std::printf("%-28s %6s %6s %10s %10s\n", "kernel", "rows", "cols", "us", "GB/s");
  for (int64_t cols : {int64_t{1024}, int64_t{2048}, int64_t{4096}}) {
    const int64_t rows = 16384;
    const auto n = static_cast<std::size_t>(rows * cols), c = static_cast<std::size_t>(cols);
    cu::Half* x = cu::upload_half(random_values(n, generator), kBf16, stream);
    cu::Half* r = cu::upload_half(random_values(n, generator), kBf16, stream);
    cu::Half* sum = cu::upload_half(random_values(n, generator), kBf16, stream);
    cu::Half* y = cu::upload_half(random_values(n, generator), kBf16, stream);
    cu::Half* dy = cu::upload_half(random_values(n, generator), kBf16, stream);
    cu::Half* dx = cu::upload_half(random_values(n, generator), kBf16, stream);
    cu::Half* gamma = cu::upload_half(random_values(c, generator), kBf16, stream);
    cu::Half* beta = cu::upload_half(random_values(c, generator), kBf16, stream);
    float* mean = cu::upload_floats(std::vector<float>(static_cast<std::size_t>(rows)), stream);
    float* rstd = cu::upload_floats(std::vector<float>(static_cast<std::size_t>(rows)), stream);
    float* dgamma = cu::upload_floats(std::vector<float>(c), stream);
    float* dbeta = cu::upload_floats(std::vector<float>(c), stream);
    void* workspace = nullptr;
    check(cudaMalloc(&workspace, cu::norm_backward_workspace_bytes(rows, cols)), "cudaMalloc");
    const float eps = 1e-5f;

    row("copy (ceiling)", rows, cols, 4,
        median_ms(stream, [&] { check(cudaMemcpyAsync(y, x, n * 2, cudaMemcpyDeviceToDevice, stream), "copy"); }));
    row("add", rows, cols, 6, median_ms(stream, [&] { cu::add(x, r, rows * cols, y, kBf16, stream); }));
    row("layernorm_forward", rows, cols, 4, median_ms(stream, [&] {
          cu::layernorm_forward(x, nullptr, kNoDropout, nullptr, gamma, beta, rows, cols, eps, y, mean, rstd, kBf16,
                                stream);
        }));
    row("layernorm_forward+residual", rows, cols, 8, median_ms(stream, [&] {
          cu::layernorm_forward(x, r, kNoDropout, sum, gamma, beta, rows, cols, eps, y, mean, rstd, kBf16, stream);
        }));
    row("layernorm_backward", rows, cols, 6, median_ms(stream, [&] {
          cu::layernorm_backward(dy, x, gamma, mean, rstd, rows, cols, nullptr, dx, dgamma, dbeta, workspace, kBf16,
                                 stream);
        }));
    row("layernorm_backward+residual", rows, cols, 8, median_ms(stream, [&] {
          cu::layernorm_backward(dy, x, gamma, mean, rstd, rows, cols, r, dx, dgamma, dbeta, workspace, kBf16, stream);
        }));
    row("rmsnorm_forward", rows, cols, 4, median_ms(stream, [&] {
          cu::rmsnorm_forward(x, nullptr, kNoDropout, nullptr, gamma, rows, cols, eps, y, rstd, kBf16, stream);
        }));
    row("rmsnorm_backward", rows, cols, 6, median_ms(stream, [&] {
          cu::rmsnorm_backward(dy, x, gamma, rstd, rows, cols, nullptr, dx, dgamma, workspace, kBf16, stream);
        }));
    row("swiglu_forward (2 width=cols)", rows, cols, 3,
        median_ms(stream, [&] { cu::swiglu_forward(dy, rows, cols / 2, y, kBf16, stream); }));
    check(cudaStreamSynchronize(stream), "bench");
    for (void* p : {static_cast<void*>(x), static_cast<void*>(r), static_cast<void*>(sum), static_cast<void*>(y),
                    static_cast<void*>(dy), static_cast<void*>(dx), static_cast<void*>(gamma), static_cast<void*>(beta),
                    static_cast<void*>(mean), static_cast<void*>(rstd), static_cast<void*>(dgamma),
                    static_cast<void*>(dbeta), workspace}) {
      cudaFree(p);
    }
  }
  return 0;
}
