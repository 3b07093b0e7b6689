// A SEND and its RECV form one transfer, which starts when both streams have reached them (NCCL's
// rendezvous): each side records when it got there, and the second to arrive learns the start.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <vector>

namespace megaplan::sim {

class TransferRendezvous {
 public:
  // `messages`: how many transfers, numbered 0 .. messages - 1 (DependencySlots::message).
  explicit TransferRendezvous(std::size_t messages) : reached_(messages) {}
  // The send side of `message` is reached at `time`: the transfer's start if the receive was
  // reached before, else nothing yet.
  std::optional<double> reach_send(std::size_t message, double time) {
    Sides& sides = reached_[message];
    return reach(sides.send, sides.receive, time);
  }
  std::optional<double> reach_receive(std::size_t message, double time) {
    Sides& sides = reached_[message];
    return reach(sides.receive, sides.send, time);
  }

 private:
  static constexpr double kNotYet = -1.0;
  static std::optional<double> reach(double& mine, double other, double time) {
    mine = time;
    if (other == kNotYet) return std::nullopt;
    return std::max(time, other);
  }
  // When each side was reached; side by side, as each reach reads both.
  struct Sides {
    double send = kNotYet;
    double receive = kNotYet;
  };
  std::vector<Sides> reached_;
};

}  // namespace megaplan::sim
