// A SEND and its RECV form one transfer, which starts when both streams have reached them (NCCL's
// rendezvous). The engine keeps each transfer's times in its receive's key: until the transfer
// begins, the key's start holds when the first side got there, and the second to arrive learns the
// start. One slot per transfer, not a table of its own: each side's arrival then touches the line
// the receiver's computation reads next.
#pragma once

#include <algorithm>
#include <optional>

namespace megaplan::sim {

constexpr double kUnknownTime = -1.0;

// When the action providing a key started (a transfer: when it began) and completed; side by side,
// as the engine reads both of a key together. Times are never negative.
struct KeyTimes {
  double started = kUnknownTime;
  double done = kUnknownTime;
};

// One side of the transfer whose receive key is `transfer` reaches it at `time` (each side once):
// the transfer's start if the other side was there before, else nothing yet. The caller records the
// transfer's times in the key once it begins.
inline std::optional<double> reach_transfer(KeyTimes& transfer, double time) {
  if (transfer.started == kUnknownTime) {
    transfer.started = time;
    return std::nullopt;
  }
  return std::max(time, transfer.started);
}

}  // namespace megaplan::sim
