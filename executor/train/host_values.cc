#include "executor/train/host_values.h"

#include <algorithm>
#include <cstring>

namespace megaplan::exec {

namespace {

// Every member's `count` doubles (this member's are `values`), in group-rank order, gathered as
// fp32 words through a backend buffer.
std::vector<double> gather_words(Comm& group, Backend& backend, const std::vector<double>& values) {
  static_assert(sizeof(double) == 2 * sizeof(float));
  const auto members = static_cast<std::size_t>(group.size());
  const std::size_t words = 2 * values.size();
  float* staging = backend.allocate(words * (members + 1));  // gathered words, then this member's
  std::vector<float> mine(words);
  std::memcpy(mine.data(), values.data(), words * sizeof(float));
  backend.upload(staging + words * members, mine.data(), words);
  try {
    group.all_gather(staging + words * members, staging, words, DType::kFloat32)->wait();
  } catch (...) {
    backend.release(staging);
    throw;
  }
  std::vector<float> gathered(words * members);
  backend.download(gathered.data(), staging, words * members);
  backend.release(staging);
  std::vector<double> result(values.size() * members);
  std::memcpy(result.data(), gathered.data(), gathered.size() * sizeof(float));
  return result;
}

}  // namespace

std::vector<double> all_gather_doubles(Comm& group, Backend& backend, double value) {
  if (group.size() == 1) return {value};
  return gather_words(group, backend, {value});
}

std::vector<std::vector<double>> all_gather_lists(Comm& group, Backend& backend, const std::vector<double>& values) {
  if (group.size() == 1) return {values};
  // The lengths first; then every list padded to the longest, which one all_gather moves.
  const std::vector<double> lengths = all_gather_doubles(group, backend, static_cast<double>(values.size()));
  const auto longest = static_cast<std::size_t>(*std::max_element(lengths.begin(), lengths.end()));
  if (longest == 0) return std::vector<std::vector<double>>(lengths.size());
  std::vector<double> padded = values;
  padded.resize(longest, 0.0);
  const std::vector<double> gathered = gather_words(group, backend, padded);
  std::vector<std::vector<double>> lists;
  for (std::size_t member = 0; member < lengths.size(); ++member) {
    const auto begin = gathered.begin() + static_cast<std::ptrdiff_t>(member * longest);
    lists.emplace_back(begin, begin + static_cast<std::ptrdiff_t>(lengths[member]));
  }
  return lists;
}

double sum_over(Comm& group, Backend& backend, double value) {
  double sum = 0;
  for (const double part : all_gather_doubles(group, backend, value)) sum += part;
  return sum;
}

}  // namespace megaplan::exec
