// The executor's communicators timed as training calls them, for the link tables of a measured
// profile (profiles/README.md): all-reduce, all-gather and reduce-scatter by bytes and group size,
// a send/receive pair by bytes, and how much longer compute and each of them take while they run
// side by side (NCCL's kernels and the GEMMs that Megatron's overlapped gradient reduction,
// parameter gather and --tp-comm-overlap run them beside share the SMs and the memory bandwidth).
//
// Every rank of the world calls measure_collectives with the same grid, in lockstep: the groups
// are made and used in the same order everywhere (members time, the others skip). Times are taken
// on each member's compute stream between Backend marks, as the executor waits for its requests:
// a call, its wait(), the next call. The repetitions are agreed over the group (the largest any
// member wants), so members issue the same calls. Group rank 0's numbers are returned.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/collective.h"
#include "core/kernel_list.h"
#include "core/measured_costs.h"
#include "executor/comm/comm.h"
#include "executor/runtime/backend.h"

namespace megaplan::exec {

struct CollectiveGrid {
  std::vector<int64_t> group_sizes;  // groups of the first g ranks of the world, each 2 <= g <= world
  std::vector<int64_t> bytes;        // the whole buffer (nccl-tests' size): all-gather's output,
                                     // reduce-scatter's input; multiples of 2 x the largest group
  // What runs beside a collective of `overlap_bytes` on the largest group (send/receive: ranks 0
  // and 1), launched pass after pass: one transformer layer's forward and backward.
  std::vector<Kernel> compute;
  int64_t overlap_bytes = 0;
  // Repetitions: as many as fit in about `target_seconds`, within these bounds.
  double target_seconds = 0.02;
  int min_repetitions = 3;
  int max_repetitions = 50;
};

// Quick: 1 MiB to 256 MiB by powers of 16; full: 64 KiB to 1 GiB by powers of 4; group sizes the
// powers of two up to `world_size`; beside: a layer of width 4096 over 4096 tokens and 256 MiB.
// REQUIRES: world_size >= 2.
CollectiveGrid collective_grid(bool quick, int64_t world_size);

// This rank's communicator of the group `ranks` (global ranks, group rank = position), or null
// when `rank` is not in it. Called by every rank of the world for each group, in the same order.
using GroupMaker = std::function<std::unique_ptr<Comm>(const std::vector<int64_t>& ranks, const std::string& label)>;

// `progress(done, total)` after each measurement (on every rank). Returns what global rank 0
// measured (empty tables on the other ranks).
// Throws std::invalid_argument for a grid the world cannot run (a group larger than the world, a
// size the group does not divide, repetitions outside 1 <= min <= max), and what the communicators
// throw (CommAborted when another rank failed).
CommTimings measure_collectives(Backend& backend, int64_t rank, int64_t world_size, const GroupMaker& make_group,
                                const CollectiveGrid& grid,
                                const std::function<void(int64_t done, int64_t total)>& progress);

// measure_collectives over NCCL on GPUs 0 .. gpus - 1 of this machine, one thread per GPU with its
// own CUDA backend, the world bootstrapped inside the process. `progress` is rank 0's.
// Throws what make_nccl_world, make_cuda_backend and measure_collectives throw (the first
// failure; the other ranks end through the world's abort).
// REQUIRES: gpus >= 2 GPUs visible.
CommTimings measure_collectives_on_gpus(int64_t gpus, const CollectiveGrid& grid,
                                        const std::function<void(int64_t done, int64_t total)>& progress);

}  // namespace megaplan::exec
