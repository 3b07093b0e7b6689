// Runs one body per rank of an in-process world on its own thread, the way a launcher runs one
// process per GPU: a failure on any rank ends every rank, and the caller sees the root cause.
#pragma once

#include <cstdint>
#include <functional>

#include "executor/comm/in_process_comm.h"

namespace megaplan::exec {

// Runs body(rank) for rank = 0 .. world_size - 1, each on a new thread (the calling thread only
// waits), and returns when every body has returned.
//
// When a body throws, its rank aborts the world with "rank R: <what()>" (the first reason wins),
// so every rank blocked in or later calling a communicator of the world throws CommAborted and
// ends. Once every thread has been joined, the first failure's exception is rethrown unchanged:
// its type (a SpecError keeps its field and rule, so the CLI prints its one line), its message
// without a rank prefix; the failing rank is in world.abort_reason(). CommAborted failures are the
// consequence of another failure and are rethrown only when every failure is one (the world timed
// out, or was aborted from outside); then the first of them.
// REQUIRES: 0 < world_size <= world.world_size() (std::invalid_argument otherwise); body is
// callable from several threads at once.
void run_rank_threads(InProcessWorld& world, int64_t world_size, const std::function<void(int64_t rank)>& body);

}  // namespace megaplan::exec
