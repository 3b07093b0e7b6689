#include "executor/train/host_values.h"

#include <cstring>

namespace megaplan::exec {

std::vector<double> all_gather_doubles(Comm& group, Backend& backend, double value) {
  static_assert(sizeof(double) == 2 * sizeof(float));
  const auto members = static_cast<std::size_t>(group.size());
  std::vector<double> values(members, value);
  if (members == 1) return values;
  float* staging = backend.allocate(2 * members + 2);  // gathered words, then this member's
  float words[2];
  std::memcpy(words, &value, sizeof value);
  backend.upload(staging + 2 * members, words, 2);
  try {
    group.all_gather(staging + 2 * members, staging, 2, DataType::kFloat32)->wait();
  } catch (...) {
    backend.release(staging);
    throw;
  }
  std::vector<float> gathered(2 * members);
  backend.download(gathered.data(), staging, 2 * members);
  backend.release(staging);
  std::memcpy(values.data(), gathered.data(), members * sizeof(double));
  return values;
}

double sum_over(Comm& group, Backend& backend, double value) {
  double sum = 0;
  for (const double part : all_gather_doubles(group, backend, value)) sum += part;
  return sum;
}

}  // namespace megaplan::exec
