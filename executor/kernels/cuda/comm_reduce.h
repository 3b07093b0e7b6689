// The one-GPU communicator's reduction (executor/comm/in_process_gpu_memory.h): one thread per
// element folds the members' inputs in order, in fp32, as the CPU communicator does (see
// in_process_memory.h for the rules), so both give the same bits. Speed does not matter here:
// that communicator serialises everything anyway.
#pragma once

#include <cuda_runtime_api.h>  // cudaStream_t

#include <cstddef>
#include <vector>

#include "executor/comm/comm.h"

namespace megaplan::exec::cuda {

// The most members one reduction takes: their pointers travel as a kernel parameter.
constexpr std::size_t kMaxCommReduceInputs = 128;

// dst[i] = ((inputs[0][i] op inputs[1][i]) op inputs[2][i]) ... for i < count, elements of `type`
// (fp32, or bf16 or fp16 as its 16 bits: widened exactly, accumulated in fp32, rounded to nearest
// even once).
// kMax keeps a NaN once met and, of equal values, the earlier input's. Device pointers; dst may be
// one of the inputs exactly (in place), no other overlap. Asynchronous on `stream`: the caller
// orders it after the members' writes of the inputs and their later work after it.
// REQUIRES: 1 <= inputs.size() <= kMaxCommReduceInputs (std::invalid_argument otherwise).
// Throws SpecError("--device", ...) when the launch fails.
void comm_reduce(void* dst, const std::vector<const void*>& inputs, std::size_t count, DType type, ReduceOp op,
                 cudaStream_t stream);

}  // namespace megaplan::exec::cuda
