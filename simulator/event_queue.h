// The engine's event queue: completions in (time, issue order) order, and nothing else — what a
// completion means is the engine's business. astra-sim's queue has the same four verbs: schedule
// an event, take the next one, say whether any remain, and the current time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace megaplan::sim {

// Small, since the heap moves it around: the action is found by rank and step.
struct Completion {
  double time;
  int64_t sequence;  // issue order: of two completions at one time, the earlier issued comes first
  uint32_t rank;
  uint32_t step;
  bool operator<(const Completion& other) const {
    return time < other.time || (time == other.time && sequence < other.sequence);
  }
};

// A binary heap written out: taking the next completion is the largest share of the engine's work
// per event, and here a removal walks the hole left at the root down to a leaf along the earlier
// child, one comparison a level, then settles the last entry up from there (usually at once: it is
// among the latest), moving entries instead of swapping them.
class EventQueue {
 public:
  void schedule(double time, uint32_t rank, uint32_t step) {
    const Completion added{time, sequence_++, rank, step};
    const std::size_t at = heap_.size();
    heap_.push_back(added);
    settle_up(at, added);
  }
  bool finished() const { return heap_.empty(); }
  // REQUIRES: !finished().
  Completion next() {
    const Completion first = heap_.front();
    const Completion last = heap_.back();
    heap_.pop_back();
    const std::size_t size = heap_.size();
    if (size > 0) {
      std::size_t at = 0;
      for (std::size_t child = 1; child < size; child = 2 * at + 1) {
        if (child + 1 < size && heap_[child + 1] < heap_[child]) ++child;
        heap_[at] = heap_[child];
        at = child;
      }
      settle_up(at, last);
    }
    now_ = first.time;
    ++taken_;
    return first;
  }
  double now() const { return now_; }       // the last completion taken
  int64_t taken() const { return taken_; }  // completions taken so far

 private:
  // Puts `entry` in the hole at `at`, or above it where it is earlier than the parents there.
  void settle_up(std::size_t at, const Completion& entry) {
    while (at > 0) {
      const std::size_t parent = (at - 1) / 2;
      if (!(entry < heap_[parent])) break;
      heap_[at] = heap_[parent];
      at = parent;
    }
    heap_[at] = entry;
  }

  std::vector<Completion> heap_;
  int64_t sequence_ = 0;
  int64_t taken_ = 0;
  double now_ = 0;
};

}  // namespace megaplan::sim
