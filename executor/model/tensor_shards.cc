#include "executor/model/tensor_shards.h"

#include <algorithm>
#include <stdexcept>

namespace megaplan::exec {

namespace {

// A row-major tensor seen as [outer, extent, inner] around the cut's dimension: a part is a
// contiguous extent / count slice of every outer row (its runs). A cut of `chunks` blocks is a cut
// of a tensor whose dimension is [chunks, extent / chunks].
struct Around {
  std::size_t extent = 1, inner = 1;
};
Around around(const std::vector<int64_t>& shape, const TensorCut& cut) {
  Around result;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    const auto extent = static_cast<std::size_t>(shape[d]);
    if (static_cast<int64_t>(d) == cut.dim)
      result.extent = extent / static_cast<std::size_t>(std::max<int64_t>(cut.chunks, 1));
    else if (static_cast<int64_t>(d) > cut.dim)
      result.inner *= extent;
  }
  return result;
}

std::string cut_text(const TensorCut& cut) {
  return "part " + std::to_string(cut.index) + " of " + std::to_string(cut.count) + " along dimension " +
         std::to_string(cut.dim);
}

}  // namespace

bool same_partition(const TensorCut& a, const TensorCut& b) {
  return a.dim == b.dim && a.count == b.count && a.chunks == b.chunks;
}

bool same_part(const TensorCut& a, const TensorCut& b) {
  return (a.count == 1 && b.count == 1) || (same_partition(a, b) && a.index == b.index);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

std::size_t elements(const std::vector<int64_t>& shape) {
  std::size_t count = 1;
  for (const int64_t extent : shape) count *= static_cast<std::size_t>(extent);
  return count;
}

bool cut_fits(const std::vector<int64_t>& global_shape, const TensorCut& cut) {
  if (cut.count < 1 || cut.index < 0 || cut.index >= cut.count || cut.chunks < 1) return false;
  if (cut.count == 1) return true;
  int64_t blocks = 0;
  if (__builtin_mul_overflow(cut.count, cut.chunks, &blocks)) return false;
  return cut.dim >= 0 && cut.dim < static_cast<int64_t>(global_shape.size()) &&
         global_shape[static_cast<std::size_t>(cut.dim)] % blocks == 0;
}

std::vector<int64_t> part_shape(std::vector<int64_t> global_shape, const TensorCut& cut) {
  if (cut.count > 1) global_shape[static_cast<std::size_t>(cut.dim)] /= cut.count;
  return global_shape;
}

PartPlacement part_placement(const std::vector<int64_t>& global_shape, const TensorCut& cut) {
  if (!cut_fits(global_shape, cut)) {
    throw std::invalid_argument("no " + cut_text(cut) + " of " + shape_text(global_shape));
  }
  if (cut.count == 1) {
    const uint64_t whole = std::max<uint64_t>(elements(global_shape), 1);
    return {whole, whole, 0};
  }
  const Around shape = around(global_shape, cut);
  const uint64_t run = shape.extent / static_cast<std::size_t>(cut.count) * shape.inner;
  return {run, shape.extent * shape.inner, static_cast<uint64_t>(cut.index) * run};
}

std::vector<float> reshard(const std::vector<std::vector<float>>& parts, const TensorCut& parts_cut,
                           const std::vector<int64_t>& global_shape, const TensorCut& wanted) {
  const std::size_t total = elements(global_shape);
  TensorCut joined = parts_cut;
  joined.index = 0;
  joined.count = static_cast<int64_t>(parts.size());
  if (parts.empty() || !cut_fits(global_shape, joined)) {
    throw std::invalid_argument("reshard: " + std::to_string(parts.size()) + " parts along dimension " +
                                std::to_string(parts_cut.dim) + " do not divide " + shape_text(global_shape));
  }
  std::vector<float> whole;
  if (parts.size() == 1) {
    whole = parts.front();
  } else {
    whole.resize(total);
    for (std::size_t k = 0; k < parts.size(); ++k) {
      if (parts[k].size() != total / parts.size()) throw std::invalid_argument("reshard: parts of unequal sizes");
      joined.index = static_cast<int64_t>(k);
      const PartPlacement place = part_placement(global_shape, joined);
      for (std::size_t start = 0; start < parts[k].size(); start += place.run) {
        std::copy_n(parts[k].data() + start, place.run, whole.data() + place.whole_index(start));
      }
    }
  }
  if (whole.size() != total) {
    throw std::invalid_argument("reshard: the part holds " + std::to_string(whole.size()) + " elements, " +
                                shape_text(global_shape) + " needs " + std::to_string(total));
  }
  if (wanted.count == 1) return whole;
  const PartPlacement place = part_placement(global_shape, wanted);
  std::vector<float> part(total / static_cast<std::size_t>(wanted.count));
  for (std::size_t start = 0; start < part.size(); start += place.run) {
    std::copy_n(whole.data() + place.whole_index(start), place.run, part.data() + start);
  }
  return part;
}

}  // namespace megaplan::exec
