// The CUDA backend: the GPT's operations on one GPU. This first version is fp32 throughout and
// deterministic (no atomics: every reduction runs in a fixed order), so a resumed run repeats an
// uninterrupted one bit for bit; linear layers go through cuBLAS, the rest are plain kernels.
// The bf16 tensor-core path (cuBLASLt epilogues, flash attention) replaces them kernel by kernel.
// The header includes no CUDA header: built without CUDA, make_cuda_backend() says so.
#pragma once

#include <memory>

#include "executor/runtime/backend.h"

namespace megaplan::exec {

// Throws SpecError("--device", ...) when megaplan was built without CUDA or no GPU is usable, or
// GPU 0 is not a Hopper (compute capability 9.0), the one architecture the kernels are built for.
std::unique_ptr<Backend> make_cuda_backend();

// The dense bf16 tensor-core peak of the GPU make_cuda_backend() uses, from its name (H100 and
// H200 datasheets), for MFU; 0 when the GPU is not one megaplan knows.
double cuda_dense_bf16_peak_flops();

}  // namespace megaplan::exec
