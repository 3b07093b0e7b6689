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
  explicit TransferRendezvous(std::size_t messages) : send_(messages, kNotYet), receive_(messages, kNotYet) {}
  // The send side of `message` is reached at `time`: the transfer's start if the receive was
  // reached before, else nothing yet.
  std::optional<double> reach_send(std::size_t message, double time) { return reach(send_, receive_, message, time); }
  std::optional<double> reach_receive(std::size_t message, double time) {
    return reach(receive_, send_, message, time);
  }

 private:
  static constexpr double kNotYet = -1.0;
  static std::optional<double> reach(std::vector<double>& mine, const std::vector<double>& other, std::size_t message,
                                     double time) {
    mine[message] = time;
    if (other[message] == kNotYet) return std::nullopt;
    return std::max(time, other[message]);
  }
  std::vector<double> send_;     // when each send side was reached
  std::vector<double> receive_;  // when each receive side was reached
};

}  // namespace megaplan::sim
