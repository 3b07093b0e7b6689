// The checkpoint the checkpoint targets read around their input, written by megaplan's own writer
// so that it stays in the current format: a one-layer SwiGLU model at tensor parallelism 2, so
// that two rank directories hold halves of every split matrix and a load joins them.
#pragma once

#include <string>

namespace megaplan::fuzz {

// Writes the checkpoint into `directory` (created) and returns its iteration directory
// (DIR/iter_0000000, holding state.json, mp_rank_00/ and mp_rank_01/). Deterministic: the same
// bytes on every call, so seeds written from one copy fit another.
std::string write_tiny_checkpoint(const std::string& directory);

}  // namespace megaplan::fuzz
