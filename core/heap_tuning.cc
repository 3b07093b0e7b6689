#include "core/heap_tuning.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace megaplan {

void keep_freed_memory_for_reuse() {
#if defined(__GLIBC__)
  // Blocks up to 32 MiB (glibc's own ceiling for its adaptive threshold) come from the heap, and up
  // to 512 MiB of free heap top is kept. Both settings are hints: a failure leaves the defaults.
  constexpr int kMmapThreshold = 32 << 20;
  constexpr int kTrimThreshold = 512 << 20;
  mallopt(M_MMAP_THRESHOLD, kMmapThreshold);
  mallopt(M_TRIM_THRESHOLD, kTrimThreshold);
#endif
}

}  // namespace megaplan
