// nccl-tests output (NVIDIA's all_reduce_perf, all_gather_perf, reduce_scatter_perf, alltoall_perf,
// sendrecv_perf) read into a profile's link tables: `megaplan profile --import-nccl-tests FILE...`
// turns measurements taken on a cluster megaplan never ran on into `collectives[]` and `p2p[]`
// (profiles/README.md).
//
// What a file says and how it is read:
// - the ranks: one "#  Rank N Group G Pid P on HOST device D [BUS] NAME" line each; their count
//   is the group size, one host means NVLink ("nvlink"), several the network ("network"); NAME
//   is the GPU, which must be one type;
// - the table: the header line naming its columns (size, count, type, redop, root where the
//   version prints it, then time, algbw, busbw out of place and again in place) and one row per
//   size; the out-of-place time (µs) and bus bandwidth (GB/s) are taken, rows of 0 bytes or 0 GB/s
//   skipped;
// - the collective, from the row's shape: a size of count x type bytes with a reduction is an
//   all-reduce, without one a send/receive pair (sendrecv_perf); count x type x ranks bytes with a
//   reduction is a reduce-scatter, without one an all-gather, or an all-to-all when the file's name
//   says alltoall (the two print alike). Rooted tests (reduce, broadcast) are refused.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/collective.h"

namespace megaplan::sim {

struct NcclTestsRun {
  std::string file;
  std::string device;              // the GPU's name as CUDA reports it
  std::optional<CollectiveOp> op;  // send/receive: nccl-tests' sendrecv_perf
  int64_t group_size = 0;
  std::string link;                                       // "nvlink" (one host) or "network"
  std::vector<std::pair<int64_t, double>> bus_bandwidth;  // (bytes, bytes/s), collectives
  std::vector<std::pair<int64_t, double>> seconds;        // (bytes, s), send/receive
};

// Throws SpecError("--import-nccl-tests", "FILE: ...") naming the first thing it cannot read.
NcclTestsRun read_nccl_tests(const std::string& text, const std::string& file);

// `profile` with each run's table entries in place of any it held for the same op, group size
// and link (collectives) or link (p2p), by replace_link_entries. `collectives` and `p2p` are
// arrays afterwards even where no run fills them.
nlohmann::json with_link_tables(nlohmann::json profile, const std::vector<NcclTestsRun>& runs);

// The one rule for adding measured entries to a profile's link table `table` ("collectives",
// "overlap" or "p2p"): an entry already there goes when a fresh one is for the same link and,
// outside "p2p", the same op and group size; the others (another link's, a smaller machine's group
// sizes) stay, and the fresh entries follow them. A table absent or not an array starts empty.
void replace_link_entries(nlohmann::json& profile, const std::string& table, const nlohmann::json& fresh);

}  // namespace megaplan::sim
