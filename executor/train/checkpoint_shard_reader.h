// Reading saved shards from model.bin files on several threads, each block's checksum computed by
// the thread that read it: whole into memory (for resharding and conversion), or streamed through
// a small window when the bytes go on as they lie (a load under the saving layout).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "executor/train/checkpoint_manifest.h"

namespace megaplan::exec::checkpoint_format {

// A shard's bytes (value, first and second moment, as model.bin holds them), read, and how many
// tensors still take them (freed after the last).
struct ReadShard {
  std::vector<float> bytes;
  int64_t uses = 0;
};
using ShardBytes = std::map<const SavedShard*, ReadShard>;

// Reads the `needed` shards (each once, however often named) into `read` on `threads` threads,
// block by block, each shard's checksum verified. Throws SpecError("--load", ...) for a short file
// or a checksum that does not match.
void read_shards(const std::vector<const SavedShard*>& needed, int64_t threads, ShardBytes& read);

// Replicated tensors (the norms' weights, the row-parallel biases, learned positions) are saved by
// every tensor-parallel rank and one copy serves: checksums each copy in `saved` of a shard in
// `read` that `read` does not hold and `mine` accepts, so that a damaged replica is refused
// whichever layout loads or converts (a load under the saving layout would read it). A loading
// world splits the copies among its ranks through `mine`, each checked once. Throws as read_shards.
void verify_unread_replicas(const std::map<std::string, std::vector<SavedShard>>& saved,
                            const std::vector<const SavedShard*>& read, int64_t threads,
                            const std::function<bool(const SavedShard&)>& mine);

// Whether stream_shards reads `shard`: format 3's blocks, none larger than a window's slot.
bool streamable(const SavedShard& shard);

// Streams the `shards` (each streamable) through `window`, `slots` blocks of kChecksumBlockBytes:
// threads read and checksum a window's worth of blocks, then on this thread deliver(k, begin,
// bytes, size) hands each block of shards[k] (its bytes [begin, begin + size)) on, and
// delivered() returns once nothing reads the window any more (an upload from it finished); then
// the next window. A shard's checksum is verified when its last block has been read, before that
// window is delivered: a damaged shard throws SpecError("--load", ...), after its earlier windows'
// blocks were delivered when it spans several.
void stream_shards(const std::vector<const SavedShard*>& shards, int64_t threads, char* window, std::size_t slots,
                   const std::function<void(std::size_t, uint64_t, const char*, uint64_t)>& deliver,
                   const std::function<void()>& delivered);

}  // namespace megaplan::exec::checkpoint_format
