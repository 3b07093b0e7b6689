// Built without CUDA there is no NCCL: make_nccl_world says so, as the other CUDA factories do.
#include "core/error.h"
#include "executor/comm/nccl_comm.h"

namespace megaplan::exec {

std::unique_ptr<NcclWorld> make_nccl_world(int64_t, int64_t, int, const IdBroadcast&, std::chrono::milliseconds) {
  throw SpecError("--device",
                  "this megaplan was built without CUDA, so without NCCL: one process per GPU needs a "
                  "CUDA build; use --device cpu in one process, whose ranks run as threads");
}

}  // namespace megaplan::exec
