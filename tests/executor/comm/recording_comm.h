// A communicator that passes every call to another and records the collectives it was asked for
// (the operation and its bytes as a profile's collective tables count them: an all-gather's output,
// a reduce-scatter's input, an all-to-all's larger side), so that a test can hold the calls a model
// makes to the list core costs (core/kernel_list.h's MoeCollective).
#pragma once

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/kernel_list.h"
#include "executor/comm/comm.h"

namespace megaplan::test {

class RecordingComm final : public exec::Comm {
 public:
  RecordingComm(exec::Comm& inner, MoeGroup group) : inner_(inner), group_(group) {}

  // What was recorded since the last call.
  std::vector<MoeCollective> take() { return std::exchange(recorded_, {}); }

  std::string name() const override { return inner_.name(); }
  int64_t rank() const override { return inner_.rank(); }
  int64_t size() const override { return inner_.size(); }
  const std::vector<int64_t>& global_ranks() const override { return inner_.global_ranks(); }
  exec::Request send(const void* data, std::size_t count, DType type, int64_t peer) override {
    return inner_.send(data, count, type, peer);
  }
  exec::Request recv(void* data, std::size_t count, DType type, int64_t peer) override {
    return inner_.recv(data, count, type, peer);
  }
  exec::Request send_recv(const void* send_data, int64_t to, void* recv_data, int64_t from, std::size_t count,
                          DType type) override {
    record(CollectiveOp::kSendRecv, count, type);
    return inner_.send_recv(send_data, to, recv_data, from, count, type);
  }
  exec::Request all_to_all(const void* input, const std::vector<std::size_t>& send_counts, void* output,
                           const std::vector<std::size_t>& recv_counts, DType type) override {
    const std::size_t sent = std::accumulate(send_counts.begin(), send_counts.end(), std::size_t{0});
    const std::size_t received = std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0});
    record(CollectiveOp::kAllToAll, std::max(sent, received), type);
    return inner_.all_to_all(input, send_counts, output, recv_counts, type);
  }
  exec::Request all_reduce(void* data, std::size_t count, DType type, exec::ReduceOp op) override {
    record(CollectiveOp::kAllReduce, count, type);
    return inner_.all_reduce(data, count, type, op);
  }
  exec::Request reduce_scatter(const void* input, void* output, std::size_t count, DType type,
                               exec::ReduceOp op) override {
    record(CollectiveOp::kReduceScatter, count * static_cast<std::size_t>(size()), type);
    return inner_.reduce_scatter(input, output, count, type, op);
  }
  exec::Request all_gather(const void* input, void* output, std::size_t count, DType type) override {
    record(CollectiveOp::kAllGather, count * static_cast<std::size_t>(size()), type);
    return inner_.all_gather(input, output, count, type);
  }
  exec::Request broadcast(void* data, std::size_t count, DType type, int64_t root) override {
    return inner_.broadcast(data, count, type, root);
  }
  void barrier() override { inner_.barrier(); }

 private:
  void record(CollectiveOp op, std::size_t count, DType type) {
    recorded_.push_back({group_, op, static_cast<int64_t>(count * dtype_bytes(type))});
  }

  exec::Comm& inner_;
  MoeGroup group_;
  std::vector<MoeCollective> recorded_;
};

}  // namespace megaplan::test
