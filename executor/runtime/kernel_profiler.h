// The executor's kernels timed through the Backend interface, as training launches them, into the
// measured tables of a megaplan-profile/1 file (profiles/README.md). What is timed comes from
// core's kernel lists (core/kernel_list.h) for GPT layers of the widths, tensor-parallel shards and
// microbatch sizes plans produce: every GEMM in its training layout with its epilogue, causal
// flash attention forward and backward, and each memory-bound kernel class (norms, residual add,
// copies, embedding, cross entropy, the optimizer's norm, AdamW, refresh and fill) by size. Kernels
// run back to back on the backend's stream as in training: each point launches its kernel for a
// warm-up, then times repetitions, each a batch of launches between two backend marks (CUDA events
// on the GPU) divided by their number, so that a mark's own cost does not count; the table holds
// the median and the spread, (p90 - p10) / median, over the repetitions. Launches rotate over
// copies of the kernel's buffers larger than the GPU's L2 together, so that operands come from HBM.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/kernel_list.h"
#include "executor/runtime/backend.h"

namespace megaplan::exec {

struct ProfileGrid {
  // GEMMs and memory-bound kernels are timed as they are; an attention forward kernel stands for
  // its point, whose forward and backward are both timed.
  std::vector<Kernel> kernels;
  double warmup_seconds = 0.01;  // launched back to back before timing (at least once)
  double batch_seconds = 1e-3;   // each repetition launches the kernel this long (at least once)
  // Repetitions: as many batches as fit in about `target_seconds`, within these bounds.
  double target_seconds = 0.02;
  int min_repetitions = 3;
  int max_repetitions = 20;
};

// Quick: 2048 and 8192 tokens, widths 768, 2048 and 4096, no tensor-parallel shards, attention at
// 1024 and 4096 tokens, the optimizer at 4 Mi and 64 Mi parameters; under a minute on an H100.
// Full: 1024 to 16384 tokens, widths 768 to 8192, tp 1, 2, 4 and 8, attention at 1024 to 8192
// tokens, the optimizer at 1 Mi to 1 Gi parameters; under five minutes.
ProfileGrid profile_grid(bool quick);

struct MeasuredTables {
  nlohmann::json gemm = nlohmann::json::array();
  nlohmann::json attention = nlohmann::json::array();
  nlohmann::json kernels = nlohmann::json::array();
};

// `progress(done, total)` after each point. Allocates each point's buffers and releases them.
MeasuredTables measure_kernels(Backend& backend, const ProfileGrid& grid,
                               const std::function<void(int64_t done, int64_t total)>& progress);

}  // namespace megaplan::exec
