// What the executor's profilers measure (executor/runtime/kernel_profiler.h,
// executor/runtime/collective_profiler.h), as plain data: the simulator writes them into a
// megaplan-profile/1 file (simulator/profile_writer.h) without knowing the executor.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/collective.h"

namespace megaplan {

// The measured tables of a profile file: "gemm", "attention" and "kernels" (profiles/README.md).
struct MeasuredTables {
  nlohmann::json gemm = nlohmann::json::array();
  nlohmann::json attention = nlohmann::json::array();
  nlohmann::json kernels = nlohmann::json::array();
  // The marks' own cost per mark (seconds), median over the sequences: what was subtracted.
  double mark_seconds = 0;
};

struct CommTiming {
  CollectiveOp op;
  int64_t group_size;
  int64_t bytes;
  double seconds;  // median of the repetitions (send/receive: one message)
};

struct OverlapTiming {
  CollectiveOp op;
  int64_t group_size;
  double compute_alone_s;      // one pass of the grid's compute, nothing beside it
  double compute_beside_s;     // the same pass while the collective runs the whole time beside it
  double collective_alone_s;   // one call of the collective (overlap_bytes), nothing beside it
  double collective_beside_s;  // the same call while the compute runs the whole time beside it
};

struct CommTimings {
  std::vector<CommTiming> collectives;  // all-reduce, all-gather, reduce-scatter
  std::vector<CommTiming> p2p;          // send/receive, ranks 0 and 1
  std::vector<OverlapTiming> overlap;   // one per op, on the largest group
};

}  // namespace megaplan
