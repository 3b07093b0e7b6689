// The engine's dense numbering of the dependency keys it tracks: forwards, input and weight
// gradients and receives (sends complete with their receive). Smaller than core's index over
// every kind, which keeps the engine's per-key arrays in cache.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/schedule/dependencies.h"

namespace megaplan::sim {

class DependencySlots {
 public:
  explicit DependencySlots(const ScheduleShape& shape)
      : stages_(static_cast<std::size_t>(shape.num_stages)),
        microbatches_(static_cast<std::size_t>(shape.microbatches)) {}
  static constexpr std::size_t kNone = SIZE_MAX;
  std::size_t size() const { return kSlots * stages_ * microbatches_; }
  // kNone for a key the engine does not track.
  std::size_t operator()(const DependencyKey& key) const {
    const std::size_t slot = slot_of(key.kind);
    if (slot == kNone) return kNone;
    // Microbatch-major: the keys in flight at one time (a window of microbatches) sit together.
    return (static_cast<std::size_t>(key.microbatch) * stages_ + static_cast<std::size_t>(key.stage)) * kSlots + slot;
  }

 private:
  static constexpr std::size_t kSlots = 5;
  static std::size_t slot_of(ActionKind kind) {
    switch (kind) {
      case ActionKind::kForward: return 0;
      case ActionKind::kBackwardInput: return 1;
      case ActionKind::kBackwardWeight: return 2;
      case ActionKind::kRecvForward: return 3;
      case ActionKind::kRecvBackward: return 4;
      default: return kNone;
    }
  }
  std::size_t stages_;
  std::size_t microbatches_;
};

}  // namespace megaplan::sim
