// AdamW over every parameter tensor in one launch (multi-tensor): fp32 master weights and
// moments, the gradient clipped by a scale first, and the model's 16-bit compute weights (bf16 or
// fp16) refreshed in the same pass. Same formulas and order of operations as
// executor/kernels/reference/adamw.h, in fp32.
#pragma once

#include <cuda_runtime_api.h>  // cudaStream_t

#include <cstdint>
#include <vector>

#include "core/implementation_options.h"
#include "executor/kernels/cuda/bf16_linear.h"

namespace megaplan::exec::cuda {

// One parameter tensor: n values in each buffer (device pointers). compute may be null (then not
// written). weight_decay is 0 for Megatron's no-decay group (biases, norms).
struct AdamwTensor {
  float* master;
  const float* gradient;
  float* exp_avg;
  float* exp_avg_sq;
  Half* compute;  // in the optimizer's precision
  int64_t n;
  float weight_decay;
};

class MultiTensorAdamw {
 public:
  // Uploads the tensor descriptors once, on `stream` (a step on another stream must be ordered
  // after it); the buffers must outlive this object. Every compute copy is of `precision`, fixed
  // with the buffers it describes.
  MultiTensorAdamw(const std::vector<AdamwTensor>& tensors, DType precision, cudaStream_t stream);
  ~MultiTensorAdamw();
  MultiTensorAdamw(const MultiTensorAdamw&) = delete;
  MultiTensorAdamw& operator=(const MultiTensorAdamw&) = delete;

  // g = gradient * grad_scale (gradient clipping: min(1, clip / norm)); then AdamW as the
  // reference (bias corrections for `step`, counted from 1; decoupled weight decay); then
  // compute = master in the constructor's precision, rounded to nearest even. Asynchronous on
  // `stream`.
  void step(int64_t step, float lr, float beta1, float beta2, float eps, float grad_scale, cudaStream_t stream);

 private:
  DType precision_;
  void* descriptors_ = nullptr;  // device array of per-tensor descriptors
  int tensor_count_ = 0;
  int64_t chunk_count_ = 0;  // blocks per step: each block updates one chunk of one tensor
};

}  // namespace megaplan::exec::cuda
