// A collective operation as every library names it: the simulator's profile tables and costs, the
// executor's collective profiler, and nccl-tests' imported outputs. Send/receive is the pair of a
// point-to-point transfer (nccl-tests' sendrecv_perf), timed and costed beside the collectives.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace megaplan {

enum class CollectiveOp : uint8_t { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kSendRecv };
// The group collectives (a profile's `collectives` table), and those with send/receive (its
// `overlap` table).
inline constexpr std::array<CollectiveOp, 4> kGroupCollectives = {
    CollectiveOp::kAllReduce, CollectiveOp::kAllGather, CollectiveOp::kReduceScatter, CollectiveOp::kAllToAll};
inline constexpr std::array<CollectiveOp, 5> kCollectiveOps = {CollectiveOp::kAllReduce, CollectiveOp::kAllGather,
                                                               CollectiveOp::kReduceScatter, CollectiveOp::kAllToAll,
                                                               CollectiveOp::kSendRecv};

std::string to_string(CollectiveOp op);  // "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"

}  // namespace megaplan
