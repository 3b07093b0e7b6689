// The engine's event queue: completions in (time, issue order) order, and nothing else — what a
// completion means is the engine's business. astra-sim's queue has the same four verbs: schedule
// an event, take the next one, say whether any remain, and the current time.
#pragma once

#include <cstdint>
#include <functional>
#include <queue>
#include <vector>

namespace megaplan::sim {

// Small, since the heap moves it around: the action is found by rank and step.
struct Completion {
  double time;
  int64_t sequence;  // issue order: of two completions at one time, the earlier issued comes first
  uint32_t rank;
  uint32_t step;
  bool operator>(const Completion& other) const {
    return time != other.time ? time > other.time : sequence > other.sequence;
  }
};

class EventQueue {
 public:
  void schedule(double time, uint32_t rank, uint32_t step) { heap_.push({time, sequence_++, rank, step}); }
  bool finished() const { return heap_.empty(); }
  // REQUIRES: !finished().
  Completion next() {
    const Completion completion = heap_.top();
    heap_.pop();
    now_ = completion.time;
    ++taken_;
    return completion;
  }
  double now() const { return now_; }       // the last completion taken
  int64_t taken() const { return taken_; }  // completions taken so far

 private:
  std::priority_queue<Completion, std::vector<Completion>, std::greater<>> heap_;
  int64_t sequence_ = 0;
  int64_t taken_ = 0;
  double now_ = 0;
};

}  // namespace megaplan::sim
