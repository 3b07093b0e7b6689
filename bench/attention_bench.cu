// Times flash attention's forward and backward on the GPT shapes the trainer uses, with Megatron's
// packed qkv [batch, seq, heads, 3, dim]. FLOPs follow FlashAttention's convention: causal forward is
// half of 4 * b * h * s^2 * d, the backward 2.5 times that. Median of 30 timed runs after warm-up,
// all on one non-blocking stream, as the backend issues them. Then ring attention's blocks (context
// parallelism) on chunks of the same models' shapes: a diagonal block (masked causally, half the
// work) and a wholly visible one, the forward merging into an fp32 out and lse, the backward adding
// into dq and a packed dkv; FLOPs 4 * b * h * chunk^2 * d for a whole block, half for the diagonal.
// Standalone: nvcc ... bench/attention_bench.cu executor/kernels/cuda/flash_attention.cu
//             executor/kernels/cuda/bf16_linear.cu executor/comm/comm.cc -lcublasLt -lcublas
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "executor/kernels/cuda/flash_attention.h"
#include "executor/kernels/cuda/stream.h"

namespace cu = megaplan::exec::cuda;

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw megaplan::SpecError("--device", std::string(what) + ": " + cudaGetErrorString(status));
}

// Roughly normal values from a counter hash (sum of four uniforms), so large inputs need no host copy.
__global__ void fill_random(cu::Half* data, int64_t n, uint32_t seed) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  float sum = 0;
  for (uint32_t part = 0; part < 4; ++part) {
    uint32_t x = static_cast<uint32_t>(i) * 4u + part + seed * 0x9e3779b9u;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    sum += static_cast<float>(x) * (1.0f / 4294967296.0f);
  }
  reinterpret_cast<__nv_bfloat16*>(data)[i] = __float2bfloat16((sum - 2.0f) * 1.7320508f);
}

cu::Half* random_buffer(int64_t n, uint32_t seed, cudaStream_t stream) {
  void* p = nullptr;
  check(cudaMalloc(&p, static_cast<size_t>(n) * 2), "cudaMalloc");
  auto* data = static_cast<cu::Half*>(p);
  fill_random<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(data, n, seed);
  check(cudaGetLastError(), "fill_random");
  return data;
}

template <typename F>
float median_ms(cudaStream_t stream, F&& f) {
  for (int i = 0; i < 5; ++i) f();
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  std::vector<float> times;
  for (int i = 0; i < 30; ++i) {
    check(cudaEventRecord(start, stream), "record");
    f();
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

struct Case {
  const char* name;
  int64_t batch, seq, heads, dim;
};

}  // namespace

int main() {
  const cu::Stream stream;
  std::printf("%-10s %-22s %9s %10s %9s %10s\n", "model", "shape", "fwd_ms", "fwd_TF/s", "bwd_ms", "bwd_TF/s");
  for (const Case c :
       {Case{"gpt-1.3b", 8, 2048, 16, 128}, Case{"gpt2-350m", 16, 1024, 16, 64}, Case{"gpt2-124m", 16, 1024, 12, 64}}) {
    const int64_t d = c.dim, token_stride = c.heads * 3 * d, tokens = c.batch * c.seq;
    const cu::AttentionShape shape{c.batch, c.seq,        c.heads, c.heads,
                                   d,       token_stride, 3 * d,   1.0f / std::sqrt(static_cast<float>(d))};
    cu::Half* qkv = random_buffer(tokens * token_stride, 1, stream);
    cu::Half* dout = random_buffer(tokens * c.heads * d, 2, stream);
    cu::Half* out = random_buffer(tokens * c.heads * d, 3, stream);
    cu::Half* dqkv = random_buffer(tokens * token_stride, 4, stream);
    void *lse = nullptr, *workspace = nullptr;
    check(cudaMalloc(&lse, static_cast<size_t>(c.batch * c.heads * c.seq) * 4), "cudaMalloc");
    check(cudaMalloc(&workspace, cu::flash_attention_backward_workspace_bytes(shape)), "cudaMalloc");
    const cu::Half *q = qkv, *k = qkv + d, *v = qkv + 2 * d;
    auto* lse_f = static_cast<float*>(lse);
    const float fwd = median_ms(
        stream, [&] { cu::flash_attention_forward(shape, q, k, v, out, lse_f, megaplan::DType::kBFloat16, stream); });
    const float bwd = median_ms(stream, [&] {
      cu::flash_attention_backward(shape, dout, q, k, v, out, lse_f, token_stride, dqkv, dqkv + d, dqkv + 2 * d,
                                   workspace, megaplan::DType::kBFloat16, stream);
    });
    const double flops = static_cast<double>(4 * c.batch * c.heads * c.seq * c.seq * d / 2);
    char label[64];
    std::snprintf(label, sizeof label, "b%lld s%lld h%lld d%lld", static_cast<long long>(c.batch),
                  static_cast<long long>(c.seq), static_cast<long long>(c.heads), static_cast<long long>(d));
    std::printf("%-10s %-22s %9.3f %10.1f %9.3f %10.1f\n", c.name, label, fwd, flops / fwd / 1e9, bwd,
                2.5 * flops / bwd / 1e9);
    for (void* p : {static_cast<void*>(qkv), static_cast<void*>(dout), static_cast<void*>(out),
                    static_cast<void*>(dqkv), lse, workspace}) {
      cudaFree(p);
    }
  }
  std::printf("\n%-10s %-30s %9s %10s %9s %10s\n", "ring", "block", "fwd_ms", "fwd_TF/s", "bwd_ms", "bwd_TF/s");
  struct RingCase {
    const char* name;
    int64_t batch, chunk, heads, dim;
  };
  for (const RingCase c : {RingCase{"gpt-1.3b", 8, 512, 16, 128}, RingCase{"gpt-1.3b", 1, 4096, 16, 128},
                           RingCase{"gpt2-350m", 16, 256, 16, 64}}) {
    const int64_t d = c.dim, local = 2 * c.chunk, token_stride = c.heads * 3 * d, tokens = c.batch * local;
    cu::AttentionBlockShape block{};
    block.shape = cu::AttentionShape{c.batch, local,        c.heads, c.heads,
                                     d,       token_stride, 3 * d,   1.0f / std::sqrt(static_cast<float>(d))};
    block.rows = c.chunk;
    const int64_t kv_elements = tokens * c.heads * 2 * d, out_elements = tokens * c.heads * d;
    cu::Half* qkv = random_buffer(tokens * token_stride, 1, stream);
    cu::Half* kv = random_buffer(kv_elements, 5, stream);
    cu::Half* dout = random_buffer(out_elements, 2, stream);
    cu::Half* out = random_buffer(out_elements, 3, stream);
    cu::Half* dqkv = random_buffer(tokens * token_stride, 4, stream);
    cu::Half* dkv = random_buffer(kv_elements, 6, stream);
    void *out32 = nullptr, *lse = nullptr, *workspace = nullptr;
    check(cudaMalloc(&out32, static_cast<size_t>(out_elements) * 4), "cudaMalloc");
    check(cudaMalloc(&lse, static_cast<size_t>(c.batch * c.heads * local) * 4), "cudaMalloc");
    check(cudaMemsetAsync(out32, 0, static_cast<size_t>(out_elements) * 4, stream), "cudaMemset");
    check(cudaMemsetAsync(lse, 0, static_cast<size_t>(c.batch * c.heads * local) * 4, stream), "cudaMemset");
    check(cudaMalloc(&workspace, cu::flash_attention_block_backward_workspace_bytes(block)), "cudaMalloc");
    for (const bool diagonal : {true, false}) {
      // The diagonal: the first chunk against itself; else the second chunk's queries against the first's keys.
      block.query_row0 = diagonal ? 0 : c.chunk;
      block.query_first = diagonal ? 0 : c.chunk;
      block.key_row0 = block.key_first = 0;
      auto* out_f = static_cast<float*>(out32);
      auto* lse_f = static_cast<float*>(lse);
      const float fwd = median_ms(stream, [&] {
        cu::flash_attention_block_forward(block, qkv, kv, out_f, lse_f, megaplan::DType::kBFloat16, stream);
      });
      const float bwd = median_ms(stream, [&] {
        cu::flash_attention_block_backward(block, dout, qkv, kv, out, lse_f, dqkv, dkv, workspace,
                                           megaplan::DType::kBFloat16, stream);
      });
      const double flops = static_cast<double>(4 * c.batch * c.heads * c.chunk * c.chunk * d) / (diagonal ? 2 : 1);
      char label[64];
      std::snprintf(label, sizeof label, "%s b%lld c%lld h%lld d%lld", diagonal ? "diag" : "full",
                    static_cast<long long>(c.batch), static_cast<long long>(c.chunk), static_cast<long long>(c.heads),
                    static_cast<long long>(d));
      std::printf("%-10s %-30s %9.3f %10.1f %9.3f %10.1f\n", c.name, label, fwd, flops / fwd / 1e9, bwd,
                  2.5 * flops / bwd / 1e9);
    }
    for (void* p : {static_cast<void*>(qkv), static_cast<void*>(kv), static_cast<void*>(dout), static_cast<void*>(out),
                    static_cast<void*>(dqkv), static_cast<void*>(dkv), out32, lse, workspace}) {
      cudaFree(p);
    }
  }
  return 0;
}
