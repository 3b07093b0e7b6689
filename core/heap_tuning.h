// Process-wide allocator settings for programs that build and drop large schedules over and over
// (megaplan's commands, the planner's many simulations, the benchmarks that stand for them).
#pragma once

namespace megaplan {

// Keeps freed memory inside the process for the next allocation instead of returning it to the
// operating system at once. glibc returns large blocks (mmap'd, or the trimmed top of the heap) on
// free, so every schedule of a million actions page-faults its 30 MB in afresh; on the
// development VM that kernel work was a quarter of generate + lower + validate (58 -> 43 ms,
// docs/results.md). Call once at the start of main, before any thread starts. No effect outside glibc.
void keep_freed_memory_for_reuse();

}  // namespace megaplan
