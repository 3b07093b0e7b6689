// InProcessMemory: how an in-process world (in_process_comm.h) moves and combines its members'
// bytes. The world does the rest — rendezvous, matching, abort, timeouts — once for every kind of
// memory: the CPU implementation here (host buffers, memcpy and loops) and the one-GPU one
// (in_process_gpu_memory.h: device buffers, copies and a reduction kernel on one stream).
//
// Contract, for every implementation:
// - The world calls these from whichever member thread completes an operation: the last member to
//   arrive at a collective (holding the group's lock), a sender for its staging copy, a receiver
//   for its copy out. Calls on different groups come from different threads at once, so an
//   implementation keeps no state between calls that two threads could share unguarded.
// - Results are those of the element-wise rules below, exactly: every implementation gives the same
//   bits (a NaN may differ in its payload).
// - A call may return before the bytes have moved (the GPU's enqueue work); it must then make
//   everything the world later asks of the same memory, and everything the members issue after the
//   world releases them, see the result.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "executor/comm/comm.h"

namespace megaplan::exec {

class InProcessMemory {
 public:
  virtual ~InProcessMemory() = default;

  // "cpu" or "gpu": the world's communicators are named "in-process-" + name().
  virtual std::string name() const = 0;

  // dst[0 .. bytes) = src[0 .. bytes).
  // REQUIRES: the ranges do not overlap (the world never asks for dst == src).
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;

  // dst[i] = ((inputs[0][i] op inputs[1][i]) op inputs[2][i]) ... for i < count: in input order,
  // in float. bf16 elements are widened exactly, accumulated in float and rounded to nearest even
  // once, at the end. kMax keeps a NaN once one is met and, of equal values (+0 and -0), the earlier
  // input's. dst may be one of the inputs exactly (an in-place reduction); no other overlap.
  // REQUIRES: !inputs.empty().
  virtual void reduce(void* dst, const std::vector<const void*>& inputs, std::size_t count, DataType type,
                      ReduceOp op) = 0;

  // Room for one buffered send's bytes between its send and its receive: allocated by the sender,
  // released after the receiver's copy out (or with the world, for a message nobody received).
  // REQUIRES: bytes > 0.
  virtual void* allocate_staging(std::size_t bytes) = 0;
  virtual void release_staging(void* staging) noexcept = 0;
};

// Host memory: memcpy, and the rules above as plain loops.
std::unique_ptr<InProcessMemory> make_in_process_cpu_memory();

}  // namespace megaplan::exec
