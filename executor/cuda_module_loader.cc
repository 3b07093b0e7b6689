// The public GPU headers of a CUDA build (gpu_inventory.h, runtime/cuda_backend.h,
// comm/in_process_gpu_memory.h, comm/nccl_comm.h, and comm/mpi_bootstrap.h where the module has
// MPI): each function loads the CUDA module on first use and forwards to it (cuda_module.h says
// why the module is separate).
#include <dlfcn.h>

#include <string>

#include "core/error.h"
#include "executor/comm/in_process_gpu_memory.h"
#include "executor/comm/mpi_bootstrap.h"
#include "executor/comm/nccl_comm.h"
#include "executor/cuda_module.h"
#include "executor/gpu_inventory.h"
#include "executor/runtime/cuda_backend.h"

namespace megaplan {
namespace {

struct LoadedModule {
  const cuda_module::Entries* entries = nullptr;  // null when the module did not load
  std::string failure;                            // the dynamic loader's reason then
};

LoadedModule load_module() {
  // The file name alone: the dynamic loader searches LD_LIBRARY_PATH, then the executable's
  // RUNPATH (the megaplan binary's is $ORIGIN, its own folder), and a module the executable links
  // already (the GPU tests) is found by its soname. RTLD_NOW: a symbol the module needs that the
  // executable lacks fails here, in one line, not at the first call that needs it. The module is
  // never unloaded: the CUDA runtime and NCCL keep threads and exit handlers of their own.
  void* module = dlopen(MEGAPLAN_CUDA_MODULE_FILE, RTLD_NOW | RTLD_LOCAL);
  if (module == nullptr) return {nullptr, dlerror()};
  using EntryPoint = const cuda_module::Entries* (*)();
  const auto entry_point = reinterpret_cast<EntryPoint>(dlsym(module, cuda_module::kEntryPoint));
  if (entry_point == nullptr) return {nullptr, dlerror()};
  return {entry_point(), ""};
}

// The module's table, loaded once per process; throws SpecError(field, ...) when the module cannot
// be loaded, as the functions of a build without CUDA do.
const cuda_module::Entries& entries(const char* field) {
  static const LoadedModule module = load_module();
  if (module.entries == nullptr) {
    throw SpecError(field,
                    std::string("cannot load megaplan's CUDA module ") + MEGAPLAN_CUDA_MODULE_FILE +
                        " (built beside the megaplan binary, it is copied with it): " + printable_line(module.failure));
  }
  return *module.entries;
}

}  // namespace

bool built_with_cuda() { return true; }

std::string built_cuda_architectures() { return entries("gpu").built_cuda_architectures(); }

GpuInventory query_gpu_inventory() { return entries("gpu").query_gpu_inventory(); }

void probe_device(int device_index) { entries("gpu").probe_device(device_index); }

namespace exec {

std::unique_ptr<Backend> make_cuda_backend(DType precision) { return entries("--device").make_cuda_backend(precision); }

double cuda_dense_bf16_peak_flops() { return entries("--device").cuda_dense_bf16_peak_flops(); }

std::unique_ptr<InProcessMemory> make_in_process_gpu_memory() {
  return entries("--device").make_in_process_gpu_memory();
}

std::unique_ptr<NcclWorld> make_nccl_world(int64_t rank, int64_t world_size, int device, const IdBroadcast& broadcast,
                                           std::chrono::milliseconds timeout) {
  return entries("--device").make_nccl_world(rank, world_size, device, broadcast, timeout);
}

// Without MPI, comm/mpi_bootstrap_none.cc backs comm/mpi_bootstrap.h (executor/CMakeLists.txt).
#ifdef MEGAPLAN_CUDA_MODULE_MPI
bool mpi_bootstrap_available() { return true; }

std::vector<uint8_t> mpi_broadcast_from_rank0(int64_t rank, int64_t world_size,
                                              const std::vector<uint8_t>& blob_on_rank0) {
  return entries("--device").mpi_broadcast_from_rank0(rank, world_size, blob_on_rank0);
}
#endif

}  // namespace exec
}  // namespace megaplan
