// Megatron DDP's contiguous parameter and gradient layout.
#include "core/parameter_layout.h"

#include <algorithm>

namespace megaplan {

std::size_t default_bucket_size(int64_t gradient_group_size) {
  return std::max<std::size_t>(40'000'000, 1'000'000 * static_cast<std::size_t>(gradient_group_size));
}

ParameterLayout layout_parameters(const std::vector<std::size_t>& sizes, std::size_t bucket_size,
                                  int64_t data_parallel_size, const std::vector<std::size_t>& alone,
                                  const std::vector<bool>& expert, int64_t expert_data_parallel_size) {
  const auto is_expert = [&](std::size_t i) { return !expert.empty() && expert[i]; };
  ParameterLayout layout;
  layout.sizes = sizes;
  layout.offsets.assign(sizes.size(), 0);
  std::size_t offset = 0;
  GradientBucket open;
  bool has_open = false;
  const auto close = [&] {
    const std::size_t used = offset - open.offset;
    const auto group = static_cast<std::size_t>(open.expert ? expert_data_parallel_size : data_parallel_size);
    open.size = (used + group - 1) / group * group;
    offset = open.offset + open.size;
    layout.buckets.push_back(open);
    has_open = false;
  };
  for (std::size_t i = sizes.size(); i-- > 0;) {
    const bool own_bucket = std::find(alone.begin(), alone.end(), i) != alone.end();
    if (has_open && (own_bucket || open.expert != is_expert(i))) close();
    if (!has_open) {
      open = GradientBucket{offset, 0, i, i, is_expert(i)};
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
