// Independent tasks spread over a few threads: checkpoints write, read and checksum their tensors
// in parallel, since one thread reaches neither the disk's nor the memory's speed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace megaplan::exec {

// Runs task(i) once for each i in [0, count), on up to `threads` threads (this one among them),
// taking the indices in increasing order. The first failure stops the threads from taking more
// and is rethrown once every thread has ended.
void run_tasks(std::size_t count, int64_t threads, const std::function<void(std::size_t)>& task);

// The threads a checkpoint's save or load uses unless told: enough to keep a local NVMe disk and
// the checksums busy, few enough to leave the training's own threads their cores.
int64_t default_checkpoint_threads();

}  // namespace megaplan::exec
