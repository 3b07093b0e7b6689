// The GPU inventory of a build without CUDA (MEGAPLAN_HAVE_CUDA off): every query says why there
// is no GPU, so `megaplan devices` and the GPU tests explain themselves instead of failing to link.
#include "core/error.h"
#include "executor/gpu_inventory.h"

namespace megaplan {
namespace {

[[noreturn]] void throw_built_without_cuda() {
  throw SpecError("gpu",
                  "megaplan was built without CUDA (the CUDA toolkit with cuBLAS, cuBLASLt and NCCL "
                  "was not found at configure time, or MEGAPLAN_CUDA was OFF)");
}

}  // namespace

bool built_with_cuda() { return false; }

std::string built_cuda_architectures() { return ""; }

GpuInventory query_gpu_inventory() { throw_built_without_cuda(); }

void probe_device(int /*device_index*/) { throw_built_without_cuda(); }

}  // namespace megaplan
