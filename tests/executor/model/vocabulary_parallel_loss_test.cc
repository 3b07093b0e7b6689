// The vocabulary-parallel cross entropy as the model runs it: two tensor-parallel ranks on threads
// (the in-process communicator, the CPU backend), each with half the vocabulary, against one rank
// with all of it. The logits sit near 200, so a reduction that shifted by anything but the rows'
// maximum would underflow or overflow in fp32 and miss.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "executor/comm/in_process_comm.h"
#include "executor/comm/rank_threads.h"
#include "executor/model/vocabulary_parallel_loss.h"
#include "executor/runtime/cpu_backend.h"

namespace {

using megaplan::exec::Activation;
using megaplan::exec::CpuBackend;
using megaplan::exec::InProcessWorld;
using megaplan::exec::run_rank_threads;
using megaplan::exec::vocabulary_parallel_cross_entropy;

struct Loss {
  double mean = 0;
  std::vector<float> lse;
};

// Row statistics of logits [tokens x columns] (vocabulary columns start .. start + columns), then
// the cross entropy over the group.
Loss cross_entropy(const std::vector<float>& logits, std::size_t columns, std::size_t start,
                   const std::vector<int64_t>& targets, const std::vector<float>& mask,
                   megaplan::exec::Comm* tensor_parallel) {
  CpuBackend backend;
  const std::size_t tokens = targets.size();
  Activation device_logits = backend.allocate_activation(logits.size());
  backend.upload(device_logits, logits.data(), logits.size());
  float* statistics = backend.allocate(3 * tokens);
  backend.cross_entropy_statistics(device_logits, targets.data(), tokens, columns, start, statistics,
                                   statistics + tokens, statistics + 2 * tokens);
  float* lse = backend.allocate(tokens);
  double loss_sum = 0;  // the CPU backend's memory is the host's
  vocabulary_parallel_cross_entropy(backend, tensor_parallel, statistics, mask.data(), tokens, lse, &loss_sum);
  Loss loss;
  loss.mean = loss_sum;
  loss.lse.assign(lse, lse + tokens);
  return loss;
}

}  // namespace

TEST_CASE("vocabulary-parallel cross entropy: two ranks' max and sum all-reduces give the whole vocabulary's",
          "[model]") {
  const std::size_t tokens = 9, vocab = 12, half = vocab / 2;
  std::mt19937 generator(17);
  std::uniform_real_distribution<float> spread(-4.0f, 4.0f);
  std::vector<float> logits(tokens * vocab);
  for (float& logit : logits) logit = 200.0f + spread(generator);
  const std::vector<int64_t> targets = {0, 11, 5, 6, 2, 9, 7, 3, 10};  // both halves hold some
  // Each token's share of the loss: the mask over the 7 masked tokens.
  const std::vector<float> mask = {1 / 7.0f, 1 / 7.0f, 0, 1 / 7.0f, 1 / 7.0f, 1 / 7.0f, 1 / 7.0f, 0, 1 / 7.0f};

  const Loss whole = cross_entropy(logits, vocab, 0, targets, mask, nullptr);
  REQUIRE(whole.mean > 0.5);  // a real loss, not a degenerate one (about log 12 for these logits)
  REQUIRE(whole.mean < 10.0);

  InProcessWorld world(2, std::chrono::milliseconds(10000));
  std::vector<Loss> ranks(2);
  run_rank_threads(world, 2, [&](int64_t rank) {
    auto tensor_parallel = world.group(rank, {0, 1}, "tp");
    const auto r = static_cast<std::size_t>(rank);
    std::vector<float> shard;
    for (std::size_t t = 0; t < tokens; ++t) {
      const auto row = logits.begin() + static_cast<std::ptrdiff_t>(t * vocab + r * half);
      shard.insert(shard.end(), row, row + static_cast<std::ptrdiff_t>(half));
    }
    ranks[r] = cross_entropy(shard, half, r * half, targets, mask, tensor_parallel.get());
  });
  // fp32 sums of two shards' terms against one fp32 pass: a few ulps of numbers near 200.
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(ranks[r].mean == Approx(whole.mean).epsilon(1e-5));
    for (std::size_t t = 0; t < tokens; ++t) CHECK(ranks[r].lse[t] == Approx(whole.lse[t]).epsilon(1e-6));
  }
  CHECK(ranks[0].mean == ranks[1].mean);  // one all-reduced result: the same bits on every rank
  CHECK(ranks[0].lse == ranks[1].lse);
}
