// The one-GPU InProcessMemory: every rank of an in-process world is a thread of this process whose
// buffers live on GPU 0, so any layout trains on a single GPU — slowly, but exactly as the ranks'
// arithmetic says ("in-process-gpu"). The world (in_process_comm.h) does the rendezvous, matching,
// abort and timeouts as for the CPU; this memory moves bytes with cudaMemcpyAsync (device to device)
// and reduces with executor/kernels/cuda/comm_reduce.h, every operation enqueued, none waited for.
//
// Streams. Every rank's CUDA backend issues its work on a compute stream of its own; every group
// moves bytes on a stream of its own (its lane); points are CUDA events. So the ranks' work and the
// groups' copies are ordered only by the events the world records and waits for (see
// in_process_memory.h): a collective's copies and reduction kernel start after every member's
// event from its call, each member's work after wait() starts after the lane's event; a send's copy
// into staging (cudaMallocAsync, stream-ordered on the lane) after the sender's event, the copy out
// after the send's copy and the receiver's event, the staging freed (cudaFreeAsync) behind it.
// Reductions fold the members in group-rank order with the CPU communicator's rules, so a layout's
// result is the single GPU's arithmetic in a fixed order: a run repeats bit for bit.
//
// What it costs. The ranks share one GPU's SMs and memory (memory is the sum of every rank's), and
// each collective adds an event per member. It is a correctness tool — every layout against the
// single-rank run on one GPU — not a way to train fast.
// The header includes no CUDA header: built without CUDA, make_in_process_gpu_memory() says so.
#pragma once

#include <memory>

#include "executor/comm/in_process_memory.h"

namespace megaplan::exec {

// Throws SpecError("--device", ...) when megaplan was built without CUDA, its CUDA module cannot be
// loaded, or no GPU is usable.
std::unique_ptr<InProcessMemory> make_in_process_gpu_memory();

}  // namespace megaplan::exec
