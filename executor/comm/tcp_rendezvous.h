// The TCP rendezvous that bootstraps a multi-process world: rank 0 hands a small blob (NCCL's
// 128-byte unique id) to every other rank over one TCP port, MASTER_ADDR:MASTER_PORT, as
// torch.distributed's TCPStore does for NCCL. POSIX sockets only, so it runs without GPUs.
//
// Semantics:
// - Rank 0 listens on MASTER_PORT on every interface (IPv6 dual-stack where the host has IPv6,
//   else IPv4), with SO_REUSEADDR so a restarted job can take the port back at once.
// - Every other rank resolves MASTER_ADDR (a name or an IPv4/IPv6 address) and connects, retrying
//   until the timeout because rank 0 may start later. It sends a header: a magic tag, its rank and
//   the world size. Rank 0 refuses (and tells the peer why) a header from another job's world size,
//   a rank outside 1..world_size-1 or a rank already connected, and drops connections that are not
//   a rendezvous at all (no magic tag); it keeps waiting for the ranks it still lacks.
// - Rank 0 answers only once all world_size-1 ranks are connected, so the call is also a barrier:
//   either every rank gets the blob or every connected rank gets the same error.
// - Everything is bounded by `timeout`, counted from each rank's own call. A missing rank ends
//   rank 0 (and every connected rank) with SpecError("MASTER_ADDR", "rank(s) 2, 3 did not connect
//   to port P within 30 s ...").
// - world_size 1 touches no network. No global state; every socket is closed on return or throw.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace megaplan::exec {

// Returns rank 0's blob on every rank (blob_on_rank0 is read on rank 0 only; at most 1 MiB).
// Throws SpecError("MASTER_ADDR" or "MASTER_PORT", ...) on refusal, unreachable rank 0, a bad
// reply or the timeout.
// REQUIRES: 0 <= rank < world_size; 1 <= port <= 65535.
std::vector<uint8_t> tcp_broadcast_from_rank0(int64_t rank, int64_t world_size, const std::string& address, int port,
                                              const std::vector<uint8_t>& blob_on_rank0,
                                              std::chrono::milliseconds timeout);

}  // namespace megaplan::exec
