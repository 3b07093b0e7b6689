// The one-GPU communicator's reduction (executor/comm/in_process_gpu_memory.h): one thread per
// element folds the members' inputs in order, in fp32, as the CPU communicator does (see
// InProcessMemory::reduce for the rules), so both give the same bits. Speed does not matter here:
// that communicator serialises everything anyway.
//
// It runs on the legacy default stream (cudaStreamLegacy), the one stream every rank's CUDA backend
// issues its work on: stream order alone puts it after the members' earlier work and before their
// later work. (So no stream argument, unlike a launcher meant to overlap.)
#pragma once

#include <cstddef>
#include <vector>

#include "executor/comm/comm.h"

namespace megaplan::exec::cuda {

// The most members one reduction takes: their pointers travel as a kernel parameter.
constexpr std::size_t kMaxCommReduceInputs = 128;

// dst[i] = ((inputs[0][i] op inputs[1][i]) op inputs[2][i]) ... for i < count, elements of `type`
// (fp32, or bf16 as its 16 bits: widened exactly, accumulated in fp32, rounded to nearest even once).
// kMax keeps a NaN once met and, of equal values, the earlier input's. Device pointers; dst may be
// one of the inputs exactly (in place), no other overlap. Asynchronous.
// REQUIRES: 1 <= inputs.size() <= kMaxCommReduceInputs (std::invalid_argument otherwise).
// Throws SpecError("--device", ...) when the launch fails.
void comm_reduce(void* dst, const std::vector<const void*>& inputs, std::size_t count, DataType type, ReduceOp op);

}  // namespace megaplan::exec::cuda
