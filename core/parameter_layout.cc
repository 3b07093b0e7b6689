// Megatron DDP's contiguous parameter and gradient layout.
#include "core/parameter_layout.h"

#include <algorithm>

namespace megaplan {

std::size_t default_bucket_size(int64_t gradient_group_size) {
  return std::max<std::size_t>(40'000'000, 1'000'000 * static_cast<std::size_t>(gradient_group_size));
}

ParameterLayout layout_parameters(const std::vector<std::size_t>& sizes, std::size_t bucket_size,
                                  int64_t data_parallel_size, const std::vector<std::size_t>& alone) {
  const auto dp = static_cast<std::size_t>(data_parallel_size);
  ParameterLayout layout;
  layout.sizes = sizes;
  layout.offsets.assign(sizes.size(), 0);
  std::size_t offset = 0;
  GradientBucket open;
  bool has_open = false;
  const auto close = [&] {
    const std::size_t used = offset - open.offset;
    open.size = (used + dp - 1) / dp * dp;
    offset = open.offset + open.size;
    layout.buckets.push_back(open);
    has_open = false;
  };
  for (std::size_t i = sizes.size(); i-- > 0;) {
    const bool own_bucket = std::find(alone.begin(), alone.end(), i) != alone.end();
    if (own_bucket && has_open) close();
    if (!has_open) {
      open = GradientBucket{offset, 0, i, i};
      has_open = true;
    }
    offset = (offset + kParameterAlignment - 1) / kParameterAlignment * kParameterAlignment;
    layout.offsets[i] = offset;
    offset += sizes[i];
    open.first_parameter = i;
    if (own_bucket || offset - open.offset >= bucket_size) close();
  }
  if (has_open) close();
  layout.total = offset;
  return layout;
}

}  // namespace megaplan
