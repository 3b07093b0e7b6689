#include "core/error.h"
#include "executor/comm/in_process_gpu_memory.h"

namespace megaplan::exec {

std::unique_ptr<InProcessMemory> make_in_process_gpu_memory() {
  throw SpecError("--device", "this megaplan was built without CUDA; use --device cpu");
}

}  // namespace megaplan::exec
