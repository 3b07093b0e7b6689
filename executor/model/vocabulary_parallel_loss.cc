#include "executor/model/vocabulary_parallel_loss.h"

#include <cmath>

namespace megaplan::exec {

double vocabulary_parallel_cross_entropy(Backend& backend, Comm* tensor_parallel, float* statistics,
                                         const float* mask, std::size_t tokens, std::vector<float>& lse) {
  // host = [lse_s | target]; peak starts as this shard's lse (the whole vocabulary's without tp).
  std::vector<float> host(2 * tokens);
  backend.download(host.data(), statistics, host.size());
  std::vector<float> peak(host.begin(), host.begin() + static_cast<std::ptrdiff_t>(tokens));
  if (tensor_parallel) {
    tensor_parallel->all_reduce(statistics, tokens, DataType::kFloat32, ReduceOp::kMax)->wait();
    backend.download(peak.data(), statistics, tokens);
  }
  shift_by_peak(host.data(), peak.data(), tokens, host.data());
  if (tensor_parallel) {
    backend.upload(statistics, host.data(), tokens);  // the terms beside the shard's target logits
    tensor_parallel->all_reduce(statistics, 2 * tokens, DataType::kFloat32, ReduceOp::kSum)->wait();
    backend.download(host.data(), statistics, host.size());
  }
  return finish_cross_entropy(peak.data(), host.data(), host.data() + tokens, mask, tokens, lse);
}

void shift_by_peak(const float* shard_lse, const float* peak, std::size_t tokens, float* terms) {
  for (std::size_t t = 0; t < tokens; ++t) {
    terms[t] = static_cast<float>(std::exp(static_cast<double>(shard_lse[t]) - static_cast<double>(peak[t])));
  }
}

double finish_cross_entropy(const float* peak, const float* term_sum, const float* target, const float* mask,
                            std::size_t tokens, std::vector<float>& lse) {
  lse.resize(tokens);
  double loss = 0, count = 0;
  for (std::size_t t = 0; t < tokens; ++t) {
    const double row_lse = static_cast<double>(peak[t]) + std::log(static_cast<double>(term_sum[t]));
    lse[t] = static_cast<float>(row_lse);
    loss += mask[t] * (row_lse - target[t]);
    count += mask[t];
  }
  return count > 0 ? loss / count : 0.0;
}

}  // namespace megaplan::exec
