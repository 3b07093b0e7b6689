// InProcessMemory: how an in-process world (in_process_comm.h) moves and combines its members'
// bytes, and how that work is ordered against the members' own. The world does the rest —
// rendezvous, matching, abort, timeouts — once for every kind of memory: the CPU implementation
// here (host buffers, memcpy and loops, all synchronous) and the one-GPU one
// (in_process_gpu_memory.h: device buffers, copies and a reduction kernel on streams, ordered by
// events).
//
// The model, for both. Each member issues its work on a compute stream of its own (its backend's
// compute_stream(); null on the CPU). Each group moves bytes on a Lane of its own. Ordering crosses
// streams only through Points: record(stream) marks what a stream has been given so far, and
// wait(stream, point) makes what the stream is given afterwards start after it. A collective's lane
// waits for every member's point taken at its call, does the copies and reductions, and records a
// point that each member's stream waits for in request->wait(); a send's copy into staging waits
// for the sender's point, a receive's copy out for the send's copy and the receiver's point. Every
// point is recorded before anything waits for it, so no wait can close a cycle.
//
// Contract, for every implementation:
// - The world calls a lane from whichever member thread completes an operation (the last member to
//   arrive at a collective, a sender for its staging copy, a receiver for its copy out), so calls on
//   one lane may come from several threads at once; work from one thread runs in that thread's
//   order. Calls on different lanes and memory-level calls are independent.
// - Results are those of the element-wise rules below, exactly: every implementation gives the same
//   bits (a NaN may differ in its payload).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "executor/comm/comm.h"

namespace megaplan::exec {

// What a stream had been given when the point was recorded (a CUDA event; nothing on the CPU, where
// work is done when its call returns). Null is a point every stream has already passed.
class StreamPointImpl {
 public:
  virtual ~StreamPointImpl() = default;
};
using StreamPoint = std::shared_ptr<const StreamPointImpl>;

// One group's ordered byte movement.
class Lane {
 public:
  virtual ~Lane() = default;

  // Work given to this lane afterwards starts after `point` (null: no wait).
  virtual void wait(const StreamPoint& point) = 0;
  // What this lane has been given so far.
  virtual StreamPoint record() = 0;

  // dst[0 .. bytes) = src[0 .. bytes).
  // REQUIRES: the ranges do not overlap (the world never asks for dst == src).
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;

  // dst[i] = ((inputs[0][i] op inputs[1][i]) op inputs[2][i]) ... for i < count: in input order,
  // in float. bf16 elements are widened exactly, accumulated in float and rounded to nearest even
  // once, at the end. kMax keeps a NaN once one is met and, of equal values (+0 and -0), the earlier
  // input's. dst may be one of the inputs exactly (an in-place reduction); no other overlap.
  // REQUIRES: !inputs.empty().
  virtual void reduce(void* dst, const std::vector<const void*>& inputs, std::size_t count, DType type,
                      ReduceOp op) = 0;

  // Room for one buffered send's bytes between its send and its receive: allocated by the sender,
  // released after the receiver's copy out (or with the world, for a message nobody received), both
  // in this lane's order.
  // REQUIRES: bytes > 0.
  virtual void* allocate_staging(std::size_t bytes) = 0;
  virtual void release_staging(void* staging) noexcept = 0;
};

class InProcessMemory {
 public:
  virtual ~InProcessMemory() = default;

  // "cpu" or "gpu": the world's communicators are named "in-process-" + name().
  virtual std::string name() const = 0;

  // A lane for one group. It must outlive the staging it hands out.
  virtual std::unique_ptr<Lane> make_lane() = 0;

  // A member's compute stream (null: the host, whose work is done when issued): what it has been
  // given so far, and its later work made to start after `point`.
  virtual StreamPoint record(void* stream) = 0;
  virtual void wait(void* stream, const StreamPoint& point) = 0;
};

// Host memory: memcpy, and the rules above as plain loops; points are null.
std::unique_ptr<InProcessMemory> make_in_process_cpu_memory();

}  // namespace megaplan::exec
