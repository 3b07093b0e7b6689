// Linear layers on bf16 tensor cores through cuBLASLt, with the bias, GELU and bias-gradient work
// fused into the GEMMs' epilogues: the building block of the bf16 CUDA backend. bf16 values are
// held as their 16 bits (Bf16), so this header needs no CUDA header beyond the runtime API's types.
#pragma once

#include <cuda_runtime_api.h>  // cudaStream_t

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace megaplan::exec::cuda {

using Bf16 = uint16_t;  // bfloat16 bits

enum class LinearEpilogue { kNone, kBias, kBiasGelu };

class Bf16Linear {
 public:
  // A cuBLASLt handle and a 32 MiB workspace on the current device; throws SpecError("--device", ...).
  // Every GEMM runs on the stream its call names, all sharing the one workspace: calls on different
  // streams must not overlap.
  Bf16Linear();
  ~Bf16Linear();
  Bf16Linear(const Bf16Linear&) = delete;
  Bf16Linear& operator=(const Bf16Linear&) = delete;

  // y[m x n] = epilogue(x[m x k] W^T + bias) with W stored [n x k]; fp32 accumulation. kBiasGelu
  // (the tanh GELU) also writes the pre-activation x W^T + bias to `pre_activation` [m x n].
  void forward(const Bf16* x, const Bf16* w, const Bf16* bias, int64_t m, int64_t k, int64_t n,
               LinearEpilogue epilogue, Bf16* y, Bf16* pre_activation, cudaStream_t stream);
  // dx[m x k] = dy W (bf16; null: skipped); dw[n x k] += dy^T x in fp32 (null: skipped, with the
  // bias gradient); bias_gradient[n] = the column sums of dy in fp32, fused into the
  // weight-gradient GEMM (overwritten; null: none).
  void backward(const Bf16* dy, const Bf16* x, const Bf16* w, int64_t m, int64_t k, int64_t n, Bf16* dx, float* dw,
                float* bias_gradient, cudaStream_t stream);
  // The input gradient through a GELU, for the MLP's second layer y = GELU(pre) W^T + b:
  // d_pre[m x k] = (dy W) * GELU'(pre_activation), with the forward's kBiasGelu pre-activation
  // (the DGELU epilogue). The first layer's bias gradient then comes from its own backward.
  void backward_data_through_gelu(const Bf16* dy, const Bf16* w, int64_t m, int64_t k, int64_t n,
                                  const Bf16* pre_activation, Bf16* d_pre, cudaStream_t stream);
  // From now on the 16-bit operands, outputs and biases are fp16, the same buffers' bits read as
  // fp16 (true) or bf16 (false, the default): the profiler times Megatron's fp16 GEMMs so.
  void set_fp16(bool fp16) { fp16_ = fp16; }

 private:
  bool fp16_ = false;
  void* handle_ = nullptr;
  void* workspace_ = nullptr;
  std::unique_ptr<struct GemmAlgorithms> algorithms_;  // the chosen algorithm per GEMM shape
};

// Round to nearest even, as the device converts.
Bf16 to_bf16(float value);
float from_bf16(Bf16 value);

// Device memory for tests and benchmarks: uploads (rounding floats to bf16) queued on `stream`;
// downloads that come after the stream's earlier work (they wait for the stream); frees (cudaFree:
// a wait for the whole device).
Bf16* upload_bf16(const std::vector<float>& host, cudaStream_t stream);
float* upload_floats(const std::vector<float>& host, cudaStream_t stream);
std::vector<float> download_bf16(const Bf16* device, std::size_t n, cudaStream_t stream);
std::vector<float> download_floats(const float* device, std::size_t n, cudaStream_t stream);
void free_device(void* device);

}  // namespace megaplan::exec::cuda
