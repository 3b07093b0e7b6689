// The host's memory as Linux reports it: what the CPU backend can allocate, and what an
// --async-save image must fit in.
#pragma once

#include <cstdint>

namespace megaplan::exec {

// Bytes that can be allocated without swapping: /proc/meminfo's MemAvailable (free memory plus
// reclaimable cache), or the free pages where the kernel does not report it.
int64_t host_available_bytes();

}  // namespace megaplan::exec
