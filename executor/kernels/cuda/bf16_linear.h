// Linear layers on bf16 or fp16 tensor cores through cuBLASLt, with the bias, GELU and
// bias-gradient work fused into the GEMMs' epilogues: the building block of the CUDA backend.
// 16-bit values are held as their bits (Half), so this header needs no CUDA header beyond the
// runtime API's types. Also the host's conversions and device buffers every kernel test uses.
#pragma once

#include <cuda_runtime_api.h>  // cudaStream_t

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/gemm.h"
#include "core/implementation_options.h"
#include "executor/comm/comm.h"

namespace megaplan::exec::cuda {

using Half = uint16_t;  // the bits of a bf16 or an fp16 value, as the call's DType says

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
  void forward(const Half* x, const Half* w, const Half* bias, int64_t m, int64_t k, int64_t n, GemmEpilogue epilogue,
               Half* y, Half* pre_activation, cudaStream_t stream);
  // dx[m x k] = dy W (16-bit; null: skipped); dw[n x k] += dy^T x in fp32 (null: skipped, with the
  // bias gradient); bias_gradient[n] = the column sums of dy in fp32, fused into the
  // weight-gradient GEMM (overwritten; null: none).
  void backward(const Half* dy, const Half* x, const Half* w, int64_t m, int64_t k, int64_t n, Half* dx, float* dw,
                float* bias_gradient, cudaStream_t stream);
  // The input gradient through a GELU, for the MLP's second layer y = GELU(pre) W^T + b:
  // d_pre[m x k] = (dy W) * GELU'(pre_activation), with the forward's kBiasGelu pre-activation
  // (the DGELU epilogue). The first layer's bias gradient then comes from its own backward.
  void backward_data_through_gelu(const Half* dy, const Half* w, int64_t m, int64_t k, int64_t n,
                                  const Half* pre_activation, Half* d_pre, cudaStream_t stream);
  // From now on the 16-bit operands, outputs and biases are fp16 (true) or bf16 (false, the
  // default), the same buffers' bits read so: the backend's precision, or the profiler timing
  // Megatron's fp16 GEMMs on a bf16 backend.
  void set_fp16(bool fp16) { fp16_ = fp16; }

 private:
  bool fp16_ = false;
  void* handle_ = nullptr;
  void* workspace_ = nullptr;
  std::unique_ptr<struct GemmAlgorithms> algorithms_;  // the chosen algorithm per GEMM shape
};

// Round to nearest even, as the device converts (fp16 overflows to infinity); widening is exact.
Half to_half(float value, DType precision);
float from_half(Half value, DType precision);

// Device memory for tests and benchmarks: uploads (rounding floats to `precision`) queued on
// `stream`; downloads that come after the stream's earlier work (they wait for the stream); frees
// (cudaFree: a wait for the whole device).
Half* upload_half(const std::vector<float>& host, DType precision, cudaStream_t stream);
float* upload_floats(const std::vector<float>& host, cudaStream_t stream);
std::vector<float> download_half(const Half* device, std::size_t n, DType precision, cudaStream_t stream);
std::vector<float> download_floats(const float* device, std::size_t n, cudaStream_t stream);
void free_device(void* device);

}  // namespace megaplan::exec::cuda
