// The CUDA module's entry point: the table of cuda_module.h, over the definitions in the module's
// other files.
#include "executor/cuda_module.h"

extern "C" const megaplan::cuda_module::Entries* megaplan_cuda_module_entries() {
  namespace m = megaplan::cuda_module;
  static constexpr m::Entries kEntries{
      .built_cuda_architectures = &m::built_cuda_architectures,
      .query_gpu_inventory = &m::query_gpu_inventory,
      .probe_device = &m::probe_device,
      .make_cuda_backend = &m::make_cuda_backend,
      .cuda_dense_bf16_peak_flops = &m::cuda_dense_bf16_peak_flops,
      .make_in_process_gpu_memory = &m::make_in_process_gpu_memory,
      .make_nccl_world = &m::make_nccl_world,
#ifdef MEGAPLAN_CUDA_MODULE_MPI
      .mpi_broadcast_from_rank0 = &m::mpi_broadcast_from_rank0,
#else
      .mpi_broadcast_from_rank0 = nullptr,
#endif
  };
  return &kEntries;
}
