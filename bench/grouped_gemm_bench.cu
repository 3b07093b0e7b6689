// Each expert's GEMM over its run of rows, three ways, as an MoE layer's forward issues them after
// the dispatch has told the host the rows per expert (the GPU idle while the host launches): one
// cuBLASLt GEMM per expert through Bf16Linear (what the executor does today), cuBLAS's grouped GEMM
// (cublasGemmGroupedBatchedEx, one call for every expert), and for scale the same FLOPs as one
// GEMM over all rows (one expert). Issue 40 chooses the experts' launch by this measurement.
//
// Per shape: the wall time from the host's first launch to the GPU's end (the GPU idle before),
// the GPU time between events around the launches (the queue full), and TFLOP/s on the wall time;
// the grouped outputs are checked against the per-expert ones. Standalone (no Catch2).
//   megaplan_grouped_gemm_bench
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "executor/kernels/cuda/bf16_linear.h"
#include "executor/kernels/cuda/stream.h"

namespace cu = megaplan::exec::cuda;

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw megaplan::SpecError("--device", std::string(what) + ": " + cudaGetErrorString(status));
}
void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw megaplan::SpecError("--device", std::string(what) + ": cuBLAS status " + std::to_string(status));
  }
}

// An MoE layer's first expert GEMM (fc1: [rows x hidden] by [2 ffn x hidden]^T) at a stated load:
// `experts` experts sharing tokens x topk rows, the first `hot` of them `skew` times the others'.
struct Shape {
  const char* name;
  int64_t experts, tokens, topk, hidden, outputs;
  int64_t hot;
  double skew;
};

std::vector<int64_t> rows_per_expert(const Shape& s) {
  const double unit = static_cast<double>(s.tokens * s.topk) /
                      (static_cast<double>(s.hot) * s.skew + static_cast<double>(s.experts - s.hot));
  std::vector<int64_t> rows(static_cast<std::size_t>(s.experts));
  int64_t given = 0;
  for (int64_t e = 0; e < s.experts; ++e) {
    rows[static_cast<std::size_t>(e)] = static_cast<int64_t>(std::floor(unit * (e < s.hot ? s.skew : 1.0)));
    given += rows[static_cast<std::size_t>(e)];
  }
  rows.back() += s.tokens * s.topk - given;
  return rows;
}

template <typename T>
T* allocate(int64_t n) {
  void* p = nullptr;
  check(cudaMalloc(&p, static_cast<std::size_t>(std::max<int64_t>(n, 1)) * sizeof(T)), "cudaMalloc");
  return static_cast<T*>(p);
}

__global__ void fill_bf16(uint16_t* out, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    const float value = ((h >> 8) * (1.0f / 16777216.0f) - 0.5f) * 0.1f;
    out[i] = static_cast<uint16_t>(__float_as_uint(value) >> 16);
  }
}

struct Times {
  double wall_ms, gpu_ms;
};

// Median of `repeats`: the wall from the first launch (the device idle) to the end, and the events'.
Times time_launches(cudaStream_t stream, const std::function<void()>& launch, int repeats = 30) {
  for (int i = 0; i < 5; ++i) launch();
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  cudaEvent_t begin, end;
  check(cudaEventCreate(&begin), "cudaEventCreate");
  check(cudaEventCreate(&end), "cudaEventCreate");
  std::vector<double> walls, gpus;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    check(cudaEventRecord(begin, stream), "cudaEventRecord");
    launch();
    check(cudaEventRecord(end, stream), "cudaEventRecord");
    check(cudaEventSynchronize(end), "cudaEventSynchronize");
    walls.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    float ms = 0;
    check(cudaEventElapsedTime(&ms, begin, end), "cudaEventElapsedTime");
    gpus.push_back(ms);
  }
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  std::sort(walls.begin(), walls.end());
  std::sort(gpus.begin(), gpus.end());
  return {walls[walls.size() / 2], gpus[gpus.size() / 2]};
}

float bf16_to_float(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof value);
  return value;
}

}  // namespace

int main() {
  try {
    const std::vector<Shape> shapes = {
        {"Mixtral layer (8 of 2x14336), 4096 tokens, balanced", 8, 4096, 2, 4096, 2 * 14336, 0, 1.0},
        {"the MoE rows above (8 of 2x4096, h 2048), 4096 tokens, hot x3", 8, 4096, 2, 2048, 2 * 4096, 1, 3.0},
        {"Qwen3-30B-A3B layer (128 of 2x768), 4096 tokens, balanced", 128, 4096, 8, 2048, 2 * 768, 0, 1.0},
        {"Qwen3-30B-A3B layer, 4096 tokens, 8 experts x4", 128, 4096, 8, 2048, 2 * 768, 8, 4.0},
        {"Qwen3-30B-A3B layer, 16384 tokens, balanced", 128, 16384, 8, 2048, 2 * 768, 0, 1.0},
        {"DeepSeek-V3-like (256 of 2x2048, h 7168), 4096 tokens", 256, 4096, 8, 7168, 2 * 2048, 0, 1.0},
    };
    const cu::Stream stream;
    cu::Bf16Linear linear;
    cublasHandle_t handle;
    check(cublasCreate(&handle), "cublasCreate");
    check(cublasSetStream(handle, stream), "cublasSetStream");
    void* workspace = nullptr;
    check(cudaMalloc(&workspace, 32 << 20), "cudaMalloc");
    check(cublasSetWorkspace(handle, workspace, 32 << 20), "cublasSetWorkspace");
    std::printf("%-62s %9s %9s %9s %9s %9s %9s %9s\n", "shape", "loop ms", "(gpu)", "grouped", "(gpu)", "one GEMM",
                "loop TF/s", "grp TF/s");
    for (const Shape& s : shapes) {
      const std::vector<int64_t> rows = rows_per_expert(s);
      const int64_t all_rows = s.tokens * s.topk, k = s.hidden, n = s.outputs;
      uint16_t* x = allocate<uint16_t>(all_rows * k);
      uint16_t* w = allocate<uint16_t>(s.experts * n * k);
      uint16_t* y_loop = allocate<uint16_t>(all_rows * n);
      uint16_t* y_grouped = allocate<uint16_t>(all_rows * n);
      fill_bf16<<<1024, 256, 0, stream>>>(x, all_rows * k, 1);
      fill_bf16<<<1024, 256, 0, stream>>>(w, s.experts * n * k, 2);
      check(cudaGetLastError(), "fill_bf16");
      // Per expert: its rows' offset; the grouped call's arrays (pointers on the device).
      std::vector<int64_t> first(rows.size(), 0);
      for (std::size_t e = 1; e < rows.size(); ++e) first[e] = first[e - 1] + rows[e - 1];
      std::vector<const void*> a_ptrs, b_ptrs;
      std::vector<void*> c_ptrs;
      std::vector<int> m_array, n_array, k_array, lda, ldb, ldc, group_size;
      std::vector<cublasOperation_t> trans_a, trans_b;
      std::vector<float> alpha, beta;
      for (std::size_t e = 0; e < rows.size(); ++e) {
        if (rows[e] == 0) continue;
        // Column-major: y^T [n x rows] = W [k x n]^T x^T [k x rows].
        a_ptrs.push_back(w + static_cast<int64_t>(e) * n * k);
        b_ptrs.push_back(x + first[e] * k);
        c_ptrs.push_back(y_grouped + first[e] * n);
        m_array.push_back(static_cast<int>(n));
        n_array.push_back(static_cast<int>(rows[e]));
        k_array.push_back(static_cast<int>(k));
        lda.push_back(static_cast<int>(k));
        ldb.push_back(static_cast<int>(k));
        ldc.push_back(static_cast<int>(n));
        trans_a.push_back(CUBLAS_OP_T);
        trans_b.push_back(CUBLAS_OP_N);
        alpha.push_back(1.0f);
        beta.push_back(0.0f);
        group_size.push_back(1);
      }
      const auto groups = static_cast<int>(group_size.size());
      const void** a_device = allocate<const void*>(groups);
      const void** b_device = allocate<const void*>(groups);
      void** c_device = allocate<void*>(groups);
      check(cudaMemcpy(a_device, a_ptrs.data(), a_ptrs.size() * sizeof(void*), cudaMemcpyHostToDevice), "cudaMemcpy");
      check(cudaMemcpy(b_device, b_ptrs.data(), b_ptrs.size() * sizeof(void*), cudaMemcpyHostToDevice), "cudaMemcpy");
      check(cudaMemcpy(c_device, c_ptrs.data(), c_ptrs.size() * sizeof(void*), cudaMemcpyHostToDevice), "cudaMemcpy");

      const auto loop = [&] {
        for (std::size_t e = 0; e < rows.size(); ++e) {
          if (rows[e] == 0) continue;
          linear.forward(x + first[e] * k, w + static_cast<int64_t>(e) * n * k, nullptr, rows[e], k, n,
                         megaplan::GemmEpilogue::kNone, y_loop + first[e] * n, nullptr, stream);
        }
      };
      const auto grouped = [&] {
        check(cublasGemmGroupedBatchedEx(handle, trans_a.data(), trans_b.data(), m_array.data(), n_array.data(),
                                         k_array.data(), alpha.data(), a_device, CUDA_R_16BF, lda.data(), b_device,
                                         CUDA_R_16BF, ldb.data(), beta.data(), c_device, CUDA_R_16BF, ldc.data(),
                                         groups, group_size.data(), CUBLAS_COMPUTE_32F),
              "cublasGemmGroupedBatchedEx");
      };
      const auto one = [&] {
        linear.forward(x, w, nullptr, all_rows, k, n, megaplan::GemmEpilogue::kNone, y_loop, nullptr, stream);
      };
      const Times one_time = time_launches(stream, one);
      const Times grouped_time = time_launches(stream, grouped);
      const Times loop_time = time_launches(stream, loop);
      // The grouped outputs against the loop's (both fp32 accumulation of the same products).
      std::vector<uint16_t> a(static_cast<std::size_t>(all_rows * n)), b(a.size());
      check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      check(cudaMemcpy(a.data(), y_loop, a.size() * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
      check(cudaMemcpy(b.data(), y_grouped, b.size() * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
      double worst = 0, largest = 0;
      for (std::size_t i = 0; i < a.size(); ++i) {
        worst = std::max(worst, static_cast<double>(std::abs(bf16_to_float(a[i]) - bf16_to_float(b[i]))));
        largest = std::max(largest, static_cast<double>(std::abs(bf16_to_float(a[i]))));
      }
      const double flops = 2.0 * static_cast<double>(all_rows) * static_cast<double>(n) * static_cast<double>(k);
      std::printf("%-62s %9.3f %9.3f %9.3f %9.3f %9.3f %9.1f %9.1f   (grouped vs loop: %.1e of %.1e)\n", s.name,
                  loop_time.wall_ms, loop_time.gpu_ms, grouped_time.wall_ms, grouped_time.gpu_ms, one_time.wall_ms,
                  flops / loop_time.wall_ms / 1e9, flops / grouped_time.wall_ms / 1e9, worst, largest);
      for (void* p :
           {static_cast<void*>(x), static_cast<void*>(w), static_cast<void*>(y_loop), static_cast<void*>(y_grouped),
            static_cast<void*>(a_device), static_cast<void*>(b_device), static_cast<void*>(c_device)}) {
        cudaFree(p);
      }
    }
    cublasDestroy(handle);
    cudaFree(workspace);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "megaplan_grouped_gemm_bench: %s\n", error.what());
    return 2;
  }
  return 0;
}
