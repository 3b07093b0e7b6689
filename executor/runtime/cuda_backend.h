// The CUDA backend: the GPT's operations on one Hopper GPU in bf16 or fp16 (cuBLASLt GEMMs with
// fused epilogues, flash attention on wgmma, fp32 master weights, gradients and optimizer state).
// Deterministic (no atomics: every reduction runs in a fixed order), so a resumed run repeats an
// uninterrupted one bit for bit. The header includes no CUDA header: built without CUDA,
// make_cuda_backend() says so.
#pragma once

#include <memory>

#include "executor/runtime/backend.h"

namespace megaplan::exec {

// A backend on the calling thread's current GPU (cudaSetDevice; GPU 0 unless selected), which it
// keeps for its life: the caller calls it on that thread. Throws SpecError("--device", ...) when
// megaplan was built without CUDA, its CUDA module cannot be loaded, no GPU is usable, or the GPU
// is not a Hopper (compute capability 9.0), the one architecture the kernels are built for.
// Activations and compute weights are `precision`'s 16-bit type (fp16 under --fp16).
std::unique_ptr<Backend> make_cuda_backend(DType precision = DType::kBFloat16);

// The dense bf16 tensor-core peak of the calling thread's current GPU, the datasheet's of the preset
// GPU it is (core/device_gpu.h), for MFU; 0 when the GPU is not one megaplan knows.
double cuda_dense_bf16_peak_flops();

}  // namespace megaplan::exec
