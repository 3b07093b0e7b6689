// `megaplan devices`: lists the GPUs and the CUDA, cuBLAS, cuBLASLt and NCCL versions this process
// can use, and with --probe proves that this build runs a kernel and cuBLASLt on each GPU.
#pragma once

#include <ostream>

namespace megaplan::cli {

struct DevicesOptions {
  bool json = false;   // one JSON object instead of the text table
  bool probe = false;  // run probe_device on every GPU and report the outcome per GPU
};

// Writes the inventory to `out`. Returns the exit code: 0, or 1 when --probe found a GPU that
// failed (the table says which and why). Throws SpecError (field "gpu") when no GPU is usable or
// the build has no CUDA: that is one line for the error boundary, not a table.
int run_devices(const DevicesOptions& options, std::ostream& out);

}  // namespace megaplan::cli
