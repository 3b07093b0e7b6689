#include "core/error.h"
#include "executor/runtime/cuda_backend.h"

namespace megaplan::exec {

std::unique_ptr<Backend> make_cuda_backend(DType) {
  throw SpecError("--device",
                  "this megaplan was built without CUDA (scripts/build.sh builds one with it); use --device cpu");
}

double cuda_dense_bf16_peak_flops() { return 0; }

}  // namespace megaplan::exec
