#include "executor/model/vocabulary_parallel_loss.h"

namespace megaplan::exec {

void vocabulary_parallel_cross_entropy(Backend& backend, Comm* tensor_parallel, float* statistics, const float* weights,
                                       std::size_t tokens, float* lse, double* loss_sum) {
  float* shard_lse = statistics;
  float* target = statistics + tokens;
  float* peak = statistics + 2 * tokens;
  if (!tensor_parallel) {
    backend.cross_entropy_finish(shard_lse, nullptr, target, weights, tokens, lse, loss_sum);
    return;
  }
  tensor_parallel->all_reduce(peak, tokens, DType::kFloat32, ReduceOp::kMax)->wait();
  backend.cross_entropy_shift(peak, tokens, shard_lse);
  tensor_parallel->all_reduce(statistics, 2 * tokens, DType::kFloat32, ReduceOp::kSum)->wait();
  backend.cross_entropy_finish(peak, statistics, target, weights, tokens, lse, loss_sum);
}

}  // namespace megaplan::exec
