#include "executor/io/xxh3.h"

// Inlined from the header: nothing to load at run time (the device machines lack libxxhash).
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace megaplan::exec {

uint64_t xxh3_64(const void* data, std::size_t size) { return XXH3_64bits(data, size); }

}  // namespace megaplan::exec
