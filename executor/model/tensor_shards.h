// How tensor parallelism cuts a tensor, and moving between cuts: the one rule that initialisation
// (every rank draws its part's elements as the whole tensor's, so layouts start from the
// single-rank run's values) and checkpoints (saved under one layout, loaded under another) share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "executor/host_device.h"

namespace megaplan::exec {

// Part `index` of `count` equal parts along dimension `dim`; dim -1 or count 1: the whole tensor.
// With `chunks` > 1 the dimension is that many blocks, each cut alike: the part is the
// concatenation of every block's part `index` (SwiGLU's fc1 [gate; up]).
struct TensorCut {
  int64_t dim = -1;
  int64_t index = 0;
  int64_t count = 1;
  int64_t chunks = 1;
};

// Whether two cuts split a tensor into the same parts (dimension, count and chunks alike), and
// whether they are the same part of it (the whole tensor, however described, is one part).
bool same_partition(const TensorCut& a, const TensorCut& b);
bool same_part(const TensorCut& a, const TensorCut& b);

std::string shape_text(const std::vector<int64_t>& shape);  // "[3, 4]"
std::size_t elements(const std::vector<int64_t>& shape);

// Whether `cut` describes a part of a tensor of `global_shape` (dimension in range and divisible
// by count, 0 <= index < count).
bool cut_fits(const std::vector<int64_t>& global_shape, const TensorCut& cut);
// The shape of part `cut` of a tensor of `global_shape`. REQUIRES: cut_fits.
std::vector<int64_t> part_shape(std::vector<int64_t> global_shape, const TensorCut& cut);

// Where a part lies in the whole row-major tensor: runs of `run` consecutive elements, the part's
// run k (its elements k * run ...) at k * stride + offset in the whole. The whole tensor is one
// run. The cut's one mapping from a part's elements to the whole's, on the host and in CUDA
// kernels alike: reshard moves runs by it, and initialisation (kernels/normal_draws.h) gives each
// element of a part the value of its element in the whole.
struct PartPlacement {
  uint64_t run = 1;
  uint64_t stride = 1;
  uint64_t offset = 0;

  MEGAPLAN_HOST_DEVICE uint64_t whole_index(uint64_t part_index) const {
    return part_index / run * stride + offset + part_index % run;
  }
};
// Throws std::invalid_argument unless cut_fits(global_shape, cut).
PartPlacement part_placement(const std::vector<int64_t>& global_shape, const TensorCut& cut);

// Resharding, on row-major fp32 tensors: joins `parts` (parts[i] is part i of parts.size() under
// `parts_cut`, whose index is ignored; one part: the whole tensor) into the tensor of
// `global_shape` and returns the part `wanted` describes. Throws std::invalid_argument when the
// parts or the cut do not divide `global_shape` that way.
std::vector<float> reshard(const std::vector<std::vector<float>>& parts, const TensorCut& parts_cut,
                           const std::vector<int64_t>& global_shape, const TensorCut& wanted);

}  // namespace megaplan::exec
