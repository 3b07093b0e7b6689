// The one-GPU InProcessMemory: every rank of an in-process world is a thread of this process whose
// buffers live on GPU 0, so any layout trains on a single GPU — slowly, but exactly as the ranks'
// arithmetic says ("in-process-gpu"). The world (in_process_comm.h) does the rendezvous, matching,
// abort and timeouts as for the CPU; this memory moves bytes with cudaMemcpyAsync (device to device)
// and reduces with executor/kernels/cuda/comm_reduce.h, every operation enqueued, none waited for.
//
// Why that is exact. Every rank's CUDA backend (executor/runtime/cuda_backend.cu) issues all its
// work on the legacy default stream of device 0, and so does this memory: it is ONE stream for the
// whole process, so the GPU runs work in the order the threads enqueued it. A collective is
// enqueued by the last member to arrive, under the group's lock, after every member enqueued the
// work that produced its input (each did so before it arrived) and before any member enqueues work
// that reads the result (each is released only afterwards): stream order alone puts the copies and
// the reduction kernel between them, with no event and no host wait. A send enqueues its copy into
// a staging buffer (cudaMallocAsync, stream-ordered) before the message reaches the mailbox; the
// receive's wait() enqueues the copy out after finding it, then frees the staging with
// cudaFreeAsync behind that copy. Reductions fold the members in group-rank order with the CPU
// communicator's rules, so a layout's result is the single GPU's arithmetic in a fixed order: a run
// repeats bit for bit.
//
// What it costs. Nothing overlaps: the ranks' kernels, their copies and the collectives run one
// after another on one stream (and a host read such as a loss waits for every rank's queued work).
// It is a correctness tool — every layout against the single-rank run on one GPU — not a way to
// train fast; memory is the sum of every rank's.
//
// REQUIRES: the backends issue their work on the legacy default stream of device 0 (make_cuda_backend
// does; the .cu refuses to build with nvcc's --default-stream per-thread).
// The header includes no CUDA header: built without CUDA, make_in_process_gpu_memory() says so.
#pragma once

#include <memory>

#include "executor/comm/in_process_memory.h"

namespace megaplan::exec {

// Throws SpecError("--device", ...) when megaplan was built without CUDA or no GPU is usable.
std::unique_ptr<InProcessMemory> make_in_process_gpu_memory();

}  // namespace megaplan::exec
