// Times the loss and optimizer kernels at training sizes and prints achieved GB/s against the
// device-to-device copy ceiling: cross entropy statistics + backward over GPT-2's padded
// vocabulary, and AdamW and the gradient norm over a 350M-parameter GPT's tensors, all on one
// non-blocking stream, as the backend issues them. Standalone (no Catch2).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "executor/kernels/cuda/adamw.h"
#include "executor/kernels/cuda/cross_entropy.h"
#include "executor/kernels/cuda/reductions.h"
#include "executor/kernels/cuda/stream.h"

namespace cu = megaplan::exec::cuda;
constexpr megaplan::DType kBf16 = megaplan::DType::kBFloat16;

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw megaplan::SpecError("--device", std::string(what) + ": " + cudaGetErrorString(status));
  }
}

// Pseudo-random, never all zeros: a hash of the index mapped to [low, high).
__global__ void fill_floats(float* out, int64_t n, uint32_t seed, float low, float high) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    out[i] = low + (high - low) * (h >> 8) * (1.0f / 16777216.0f);
  }
}

__global__ void fill_bf16_from_floats(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = static_cast<uint16_t>(__float_as_uint(in[i]) >> 16);
  }
}

__global__ void fill_targets(int32_t* targets, float* mask, int64_t tokens, int32_t vocab) {
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < tokens; t += int64_t{gridDim.x} * blockDim.x) {
    targets[t] = static_cast<int32_t>((t * 7919) % vocab);
    mask[t] = 1.0f;
  }
}

void fill(float* out, int64_t n, uint32_t seed, float low, float high, cudaStream_t stream) {
  fill_floats<<<1024, 256, 0, stream>>>(out, n, seed, low, high);
  check(cudaGetLastError(), "fill_floats");
}

template <typename T>
T* allocate(int64_t n) {
  void* p = nullptr;
  check(cudaMalloc(&p, static_cast<std::size_t>(n) * sizeof(T)), "cudaMalloc");
  return static_cast<T*>(p);
}

// Median milliseconds of `repeats` runs after `warmup`, timed with events around each run.
double median_ms(cudaStream_t stream, const std::function<void()>& work, int warmup = 3, int repeats = 20) {
  for (int i = 0; i < warmup; ++i) work();
  cudaEvent_t begin, end;
  check(cudaEventCreate(&begin), "cudaEventCreate");
  check(cudaEventCreate(&end), "cudaEventCreate");
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    check(cudaEventRecord(begin, stream), "cudaEventRecord");
    work();
    check(cudaEventRecord(end, stream), "cudaEventRecord");
    check(cudaEventSynchronize(end), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, begin, end), "cudaEventElapsedTime");
    times.push_back(ms);
  }
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

struct Row {
  std::string name;
  double bytes;
  double ms;
};

}  // namespace

int main() {
  try {
    const cu::Stream stream;
    std::vector<Row> rows;
    {  // The ceiling: a large device-to-device copy, bytes read plus bytes written.
      const int64_t n = int64_t{1} << 30;
      auto* a = allocate<uint8_t>(n);
      auto* b = allocate<uint8_t>(n);
      check(cudaMemsetAsync(a, 1, n, stream), "cudaMemsetAsync");
      const double ms = median_ms(
          stream, [&] { check(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync"); });
      rows.push_back({"cudaMemcpy D2D 1 GiB", 2.0 * n, ms});
      cudaFree(a);
      cudaFree(b);
    }
    {
      const int64_t tokens = 16384, vocab = 50257, stride = 50304;
      auto* staging = allocate<float>(tokens * stride);
      auto* logits = allocate<uint16_t>(tokens * stride);
      auto* dlogits = allocate<uint16_t>(tokens * stride);
      auto* targets = allocate<int32_t>(tokens);
      auto* mask = allocate<float>(tokens);
      auto* lse = allocate<float>(tokens);
      auto* target_logit = allocate<float>(tokens);
      fill(staging, tokens * stride, 11, -6.0f, 6.0f, stream);
      fill_bf16_from_floats<<<1024, 256, 0, stream>>>(staging, logits, tokens * stride);
      check(cudaGetLastError(), "fill_bf16_from_floats");
      fill_targets<<<64, 256, 0, stream>>>(targets, mask, tokens, static_cast<int32_t>(vocab));
      check(cudaGetLastError(), "fill_targets");
      check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");  // the conversion has read staging
      cudaFree(staging);
      const double read_bytes = static_cast<double>(tokens) * ((vocab + 7) / 8 * 8) * 2;  // to the 16-byte group
      const double row_bytes = static_cast<double>(tokens) * stride * 2;
      const double statistics_ms = median_ms(stream, [&] {
        cu::cross_entropy_statistics(logits, tokens, vocab, stride, targets, lse, target_logit, nullptr, kBf16, stream);
      });
      rows.push_back({"cross entropy statistics 16384 x 50257/50304", read_bytes, statistics_ms});
      const double backward_ms = median_ms(stream, [&] {
        cu::cross_entropy_backward(logits, tokens, vocab, stride, targets, mask, lse, 1.0f / tokens, dlogits, kBf16,
                                   stream);
      });
      rows.push_back({"cross entropy backward (separate output)", read_bytes + row_bytes, backward_ms});
      const double both_ms = median_ms(stream, [&] {
        cu::cross_entropy_statistics(logits, tokens, vocab, stride, targets, lse, target_logit, nullptr, kBf16, stream);
        cu::cross_entropy_backward(logits, tokens, vocab, stride, targets, mask, lse, 1.0f / tokens, dlogits, kBf16,
                                   stream);
      });
      rows.push_back({"cross entropy statistics + backward", 2 * read_bytes + row_bytes, both_ms});
      // In place the values change each run; timing still reads and writes every row the same way.
      const double in_place_ms = median_ms(stream, [&] {
        cu::cross_entropy_backward(dlogits, tokens, vocab, stride, targets, mask, lse, 1.0f / tokens, dlogits, kBf16,
                                   stream);
      });
      rows.push_back({"cross entropy backward in place", read_bytes + row_bytes, in_place_ms});
      for (void* p : {static_cast<void*>(logits), static_cast<void*>(dlogits), static_cast<void*>(targets),
                      static_cast<void*>(mask), static_cast<void*>(lse), static_cast<void*>(target_logit)}) {
        cudaFree(p);
      }
    }
    {  // A GPT of 1024 hidden, 24 layers, GPT-2's padded vocabulary: ~355M parameters.
      const int64_t hidden = 1024, layers = 24, vocab = 50304, positions = 1024;
      std::vector<std::pair<int64_t, float>> shapes = {{vocab * hidden, 0.1f}, {positions * hidden, 0.1f}};
      for (int64_t l = 0; l < layers; ++l) {
        for (auto shape : std::vector<std::pair<int64_t, float>>{{hidden, 0},
                                                                 {hidden, 0},
                                                                 {3 * hidden * hidden, 0.1f},
                                                                 {3 * hidden, 0},
                                                                 {hidden * hidden, 0.1f},
                                                                 {hidden, 0},
                                                                 {hidden, 0},
                                                                 {hidden, 0},
                                                                 {4 * hidden * hidden, 0.1f},
                                                                 {4 * hidden, 0},
                                                                 {4 * hidden * hidden, 0.1f},
                                                                 {hidden, 0}}) {
          shapes.push_back(shape);
        }
      }
      shapes.push_back({hidden, 0});
      shapes.push_back({hidden, 0});
      int64_t total = 0;
      for (auto [n, decay] : shapes) total += n;
      auto* master = allocate<float>(total);
      auto* gradient = allocate<float>(total);
      auto* exp_avg = allocate<float>(total);
      auto* exp_avg_sq = allocate<float>(total);
      auto* compute = allocate<uint16_t>(total);
      fill(master, total, 1, -1.0f, 1.0f, stream);
      fill(gradient, total, 2, -1.0f, 1.0f, stream);
      fill(exp_avg, total, 3, -0.01f, 0.01f, stream);
      fill(exp_avg_sq, total, 4, 1e-6f, 1e-4f, stream);
      std::vector<cu::AdamwTensor> tensors;
      std::vector<cu::TensorSpan> gradients;
      int64_t offset = 0;
      for (auto [n, decay] : shapes) {
        tensors.push_back(
            {master + offset, gradient + offset, exp_avg + offset, exp_avg_sq + offset, compute + offset, n, decay});
        gradients.push_back({gradient + offset, n});
        offset += n;
      }
      cu::MultiTensorAdamw optimizer(tensors, kBf16, stream);
      int64_t step = 0;
      const double adamw_ms =
          median_ms(stream, [&] { optimizer.step(++step, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.5f, stream); });
      rows.push_back(
          {"AdamW " + std::to_string(total / 1000000) + "M params, " + std::to_string(shapes.size()) + " tensors",
           static_cast<double>(total) * (16 + 12 + 2), adamw_ms});
      cu::DeviceReducer reducer;
      const double norm_ms = median_ms(stream, [&] { (void)reducer.sum_of_squares(gradients, stream); });
      rows.push_back({"gradient norm^2 (sum of squares, to host)", static_cast<double>(total) * 4, norm_ms});
      const double sum_ms = median_ms(stream, [&] { (void)reducer.sum(gradient, total, stream); });
      rows.push_back({"sum of one flat tensor (to host)", static_cast<double>(total) * 4, sum_ms});
      for (void* p : {static_cast<void*>(master), static_cast<void*>(gradient), static_cast<void*>(exp_avg),
                      static_cast<void*>(exp_avg_sq), static_cast<void*>(compute)}) {
        cudaFree(p);
      }
    }
    cudaDeviceProp properties{};
    check(cudaGetDeviceProperties(&properties, 0), "cudaGetDeviceProperties");
    std::printf("\n%s; median of 20 runs after 3 warm-ups, CUDA events\n", properties.name);
    std::printf("%-46s %10s %10s %9s %9s\n", "kernel", "GB moved", "ms", "GB/s", "of 3350");
    for (const Row& row : rows) {
      const double gbps = row.bytes / (row.ms * 1e6);
      std::printf("%-46s %10.3f %10.3f %9.0f %8.0f%%\n", row.name.c_str(), row.bytes / 1e9, row.ms, gbps,
                  100.0 * gbps / 3350.0);
    }
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "optimizer_kernels_bench: %s\n", error.what());
    return 1;
  }
}
