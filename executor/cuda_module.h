// Internal to executor/: the CUDA module, libmegaplan_cuda.so. Everything that calls CUDA, cuBLAS,
// cuBLASLt, NCCL or MPI (NCCL's bootstrap under mpirun) is built into it, beside the megaplan
// binary, and a CUDA build loads it on first use (cuda_module_loader.cc): loading those libraries
// costs about 200 MB of memory and a large part of a second, which the commands that use no GPU
// (search, simulate, presets, ...) never pay.
//
// One table crosses the boundary, returned by the module's one C entry point. The loader
// implements the public GPU headers (gpu_inventory.h, runtime/cuda_backend.h,
// comm/in_process_gpu_memory.h, comm/nccl_comm.h, and comm/mpi_bootstrap.h where the module has
// MPI) by forwarding to it, so every function below keeps the contract of its namesake there.
// They live in namespace cuda_module, not under the public names: the module binds to the
// executable's symbols, where a public name is the forwarder, which would forward back here.
//
// The module holds no copy of core or executor. Its references to them bind to the executable
// that loads it, which exports its symbols (executor/CMakeLists.txt), so every function and every
// static exists once in a process; the module and the executable therefore come from one build.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "executor/comm/in_process_memory.h"
#include "executor/comm/nccl_comm.h"
#include "executor/gpu_inventory.h"
#include "executor/runtime/backend.h"

namespace megaplan::cuda_module {

// gpu_inventory_cuda.cc
std::string built_cuda_architectures();
GpuInventory query_gpu_inventory();
void probe_device(int device_index);

// runtime/cuda_backend.cu
std::unique_ptr<exec::Backend> make_cuda_backend(DType precision);
double cuda_dense_bf16_peak_flops();

// comm/in_process_gpu_memory.cu
std::unique_ptr<exec::InProcessMemory> make_in_process_gpu_memory();

// comm/nccl_comm.cc
std::unique_ptr<exec::NcclWorld> make_nccl_world(int64_t rank, int64_t world_size, int device,
                                                 const exec::IdBroadcast& broadcast, std::chrono::milliseconds timeout);

// comm/mpi_bootstrap.cc, in a module built with MPI (MEGAPLAN_CUDA_MODULE_MPI)
std::vector<uint8_t> mpi_broadcast_from_rank0(int64_t rank, int64_t world_size,
                                              const std::vector<uint8_t>& blob_on_rank0);

// One member per function above, of its type (qualified there: the member of the same name hides it).
struct Entries {
  decltype(&cuda_module::built_cuda_architectures) built_cuda_architectures;
  decltype(&cuda_module::query_gpu_inventory) query_gpu_inventory;
  decltype(&cuda_module::probe_device) probe_device;
  decltype(&cuda_module::make_cuda_backend) make_cuda_backend;
  decltype(&cuda_module::cuda_dense_bf16_peak_flops) cuda_dense_bf16_peak_flops;
  decltype(&cuda_module::make_in_process_gpu_memory) make_in_process_gpu_memory;
  decltype(&cuda_module::make_nccl_world) make_nccl_world;
  decltype(&cuda_module::mpi_broadcast_from_rank0) mpi_broadcast_from_rank0;  // null without MPI
};

// The name the loader looks the entry point up by.
inline constexpr const char* kEntryPoint = "megaplan_cuda_module_entries";

}  // namespace megaplan::cuda_module

// The module's entry point (C linkage, so that its name is kEntryPoint): the table, valid for the
// life of the process.
extern "C" const megaplan::cuda_module::Entries* megaplan_cuda_module_entries();
