// The engine's event queue: completions in (time, issue order) order, and nothing else — what a
// completion means is the engine's business. astra-sim's queue has the same four verbs: schedule
// an event, take the next one, say whether any remain, and the current time.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace megaplan::sim {

// The action is found by rank and step.
struct Completion {
  double time;
  int64_t sequence;  // issue order: of two completions at one time, the earlier issued comes first
  uint32_t rank;
  uint32_t step;
};

// A binary heap written out: taking the next completion is the largest share of the engine's work
// per event, and here a removal walks the hole left at the root down to a leaf along the earlier
// child, one comparison a level, then settles the last entry up from there (usually at once: it is
// among the latest), moving entries instead of swapping them. An entry's order is one unsigned
// 128-bit number, the time's bits above the issue number: compared without a branch, the earlier
// child is picked without the mispredictions a (time, then issue) comparison costs at each level.
class EventQueue {
 public:
  // REQUIRES: time >= 0 (the engine's times are sums of costs from 0).
  void schedule(double time, uint32_t rank, uint32_t step) {
    // + 0.0 makes a -0.0 +0.0, so that equal times have equal bits; a time >= 0 orders as its bits.
    const Entry added{std::bit_cast<uint64_t>(time + 0.0), sequence_++, rank, step};
    const std::size_t at = heap_.size();
    heap_.push_back(added);
    settle_up(at, added);
  }
  bool finished() const { return heap_.empty(); }
  // REQUIRES: !finished().
  Completion next() {
    const Entry first = heap_.front();
    const Entry last = heap_.back();
    heap_.pop_back();
    const std::size_t size = heap_.size();
    if (size > 0) {
      std::size_t at = 0;
      for (std::size_t child = 1; child < size; child = 2 * at + 1) {
        if (child + 1 < size) child += heap_[child + 1].order() < heap_[child].order();
        heap_[at] = heap_[child];
        at = child;
      }
      settle_up(at, last);
    }
    now_ = std::bit_cast<double>(first.time_bits);
    ++taken_;
    return {now_, static_cast<int64_t>(first.sequence), first.rank, first.step};
  }
  double now() const { return now_; }       // the last completion taken
  int64_t taken() const { return taken_; }  // completions taken so far

 private:
  __extension__ typedef unsigned __int128 Order;  // __extension__: a GCC and Clang type, not ISO C++
  struct Entry {
    uint64_t time_bits;
    uint64_t sequence;
    uint32_t rank;
    uint32_t step;
    Order order() const { return static_cast<Order>(time_bits) << 64 | sequence; }
  };

  // Puts `entry` in the hole at `at`, or above it where it is earlier than the parents there.
  void settle_up(std::size_t at, const Entry& entry) {
    while (at > 0) {
      const std::size_t parent = (at - 1) / 2;
      if (!(entry.order() < heap_[parent].order())) break;
      heap_[at] = heap_[parent];
      at = parent;
    }
    heap_[at] = entry;
  }

  std::vector<Entry> heap_;
  uint64_t sequence_ = 0;
  int64_t taken_ = 0;
  double now_ = 0;
};

}  // namespace megaplan::sim
