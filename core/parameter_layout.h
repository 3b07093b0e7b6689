// Megatron DDP's gradient layout: a model chunk's parameters in one contiguous fp32 buffer (and
// their gradients in a twin buffer laid out the same way), so that one bucket of it is one
// collective. Parameters are placed in reverse order of registration — the order the backward
// produces their gradients — and cut into buckets of at least `bucket_size` elements at parameter
// boundaries; every bucket is padded to a multiple of the data-parallel size so that the
// distributed optimizer's reduce-scatter gives each rank an equal contiguous shard of it. Gaps
// between parameters (alignment) and a bucket's padding hold zeros and are reduced like the rest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace megaplan {

// Every parameter starts at a multiple of this many elements (256 bytes of fp32, as Megatron pads
// its buffers): the multi-tensor kernels then take their vectorised path on every parameter.
inline constexpr std::size_t kParameterAlignment = 64;

struct GradientBucket {
  std::size_t offset = 0;           // elements from the buffer's start
  std::size_t size = 0;             // elements, padding included (a multiple of the data-parallel size)
  std::size_t first_parameter = 0;  // registration indices [first, last] of the parameters it holds
  std::size_t last_parameter = 0;
  // Routed experts' parameters only: reduced over the expert data-parallel group, padded to its size.
  bool expert = false;
  // The distributed optimizer's shard of data-parallel rank r: [offset + r * shard, + shard).
  std::size_t shard_size(int64_t data_parallel_size) const {
    return size / static_cast<std::size_t>(data_parallel_size);
  }
};

struct ParameterLayout {
  std::vector<std::size_t> offsets;     // by registration index
  std::vector<std::size_t> sizes;       // by registration index
  std::vector<GradientBucket> buckets;  // in buffer order: the first bucket completes first in the backward
  std::size_t total = 0;                // elements of the buffer, padding included
};

// Megatron's default bucket: 40M parameters, or 1M per rank of the group the gradients reduce over
// when that is larger (its get_model sizes it by the dp-cp group: ParallelPlan::gradient_group_size).
std::size_t default_bucket_size(int64_t gradient_group_size);

// `alone` lists registration indices that get a bucket of their own (Megatron's shared word
// embedding, whose gradient the embedding group reduces separately). `expert` (empty: none) marks
// the routed experts' parameters: a bucket holds experts' or others' only, and an expert bucket is
// padded to `expert_data_parallel_size`.
// REQUIRES: data_parallel_size >= 1, expert_data_parallel_size >= 1, bucket_size >= 1, `expert`
// empty or one entry per size.
ParameterLayout layout_parameters(const std::vector<std::size_t>& sizes, std::size_t bucket_size,
                                  int64_t data_parallel_size, const std::vector<std::size_t>& alone = {},
                                  const std::vector<bool>& expert = {}, int64_t expert_data_parallel_size = 1);

}  // namespace megaplan
