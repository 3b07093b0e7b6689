// Tensor cuts, placements and resharding (executor/model/tensor_shards.h): where initialisation
// draws a part's elements from, and what checkpoints join and cut again.
#include <catch2/catch.hpp>

#include <numeric>
#include <stdexcept>
#include <vector>

#include "executor/model/tensor_shards.h"

namespace exec = megaplan::exec;

TEST_CASE("resharding concatenates saved parts along their dimension and cuts the wanted part", "[shards]") {
  // A [4, 6, 2] tensor holding 0 .. 47, saved as 2 parts along dimension 1 (row-parallel style).
  const std::vector<int64_t> shape = {4, 6, 2};
  std::vector<float> whole(48);
  for (std::size_t i = 0; i < whole.size(); ++i) whole[i] = static_cast<float>(i);
  const auto element = [](std::size_t a, std::size_t b, std::size_t c) {
    return static_cast<float>((a * 6 + b) * 2 + c);
  };
  std::vector<std::vector<float>> halves(2);
  for (std::size_t a = 0; a < 4; ++a) {
    for (std::size_t b = 0; b < 6; ++b) {
      for (std::size_t c = 0; c < 2; ++c) halves[b / 3].push_back(element(a, b, c));
    }
  }
  CHECK(exec::reshard(halves, exec::TensorCut{1}, shape, {}) == whole);
  CHECK(exec::reshard({whole}, exec::TensorCut{}, shape, {}) == whole);
  // Part 1 of 3 along dimension 1: columns 2 and 3 of every row.
  std::vector<float> third;
  for (std::size_t a = 0; a < 4; ++a) {
    for (std::size_t b = 2; b < 4; ++b) {
      for (std::size_t c = 0; c < 2; ++c) third.push_back(element(a, b, c));
    }
  }
  CHECK(exec::reshard(halves, exec::TensorCut{1}, shape, {1, 1, 3}) == third);
  // Part 3 of 4 along dimension 0 (column-parallel style): the last row block.
  CHECK(exec::reshard(halves, exec::TensorCut{1}, shape, {0, 3, 4}) ==
        std::vector<float>(whole.begin() + 36, whole.end()));
  // Part 1 of 2 along the last dimension.
  std::vector<float> odd;
  for (std::size_t i = 1; i < 48; i += 2) odd.push_back(whole[i]);
  CHECK(exec::reshard({whole}, exec::TensorCut{}, shape, {2, 1, 2}) == odd);
  CHECK_THROWS_AS(exec::reshard(halves, exec::TensorCut{1}, shape, {1, 0, 4}),
                  std::invalid_argument);  // 6 columns in 4 parts
}

TEST_CASE("a cut fits where its dimension divides into its parts", "[shards]") {
  const std::vector<int64_t> shape = {6, 2};
  CHECK(exec::cut_fits(shape, {0, 2, 3}));
  CHECK(exec::part_shape(shape, {0, 2, 3}) == std::vector<int64_t>{2, 2});
  CHECK_FALSE(exec::cut_fits(shape, {0, 0, 4}));  // 6 rows in 4 parts
  CHECK_FALSE(exec::cut_fits(shape, {2, 0, 2}));  // no third dimension
  CHECK_FALSE(exec::cut_fits(shape, {1, 2, 2}));  // no part 2 of 2
  CHECK(exec::cut_fits(shape, {}));               // the whole tensor
}

TEST_CASE("a cut of stacked blocks takes each block's part: SwiGLU's [gate; up]", "[shards]") {
  // fc1 of an MLP 4 wide over 2 inputs, [gate; up] = rows 0-3 gate, 4-7 up, each row holding
  // 10 * row + column. Rank 1 of 2 holds [gate rows 2-3; up rows 6-7].
  const std::vector<int64_t> shape = {8, 2};
  std::vector<float> whole(16);
  for (std::size_t i = 0; i < whole.size(); ++i) whole[i] = static_cast<float>(10 * (i / 2) + i % 2);
  const exec::TensorCut rank1{0, 1, 2, 2};
  const std::vector<float> part = exec::reshard({whole}, exec::TensorCut{}, shape, rank1);
  CHECK(part == std::vector<float>{20, 21, 30, 31, 60, 61, 70, 71});
  CHECK(exec::part_shape(shape, rank1) == std::vector<int64_t>{4, 2});
  // Joined back from both ranks' parts, and resharded to 4 ranks: rank 3's [gate row 3; up row 7].
  const std::vector<float> part0 = exec::reshard({whole}, exec::TensorCut{}, shape, {0, 0, 2, 2});
  CHECK(exec::reshard({part0, part}, exec::TensorCut{0, 0, 2, 2}, shape, {}) == whole);
  CHECK(exec::reshard({part0, part}, exec::TensorCut{0, 0, 2, 2}, shape, {0, 3, 4, 2}) ==
        std::vector<float>{30, 31, 70, 71});
  CHECK_FALSE(exec::cut_fits(shape, {0, 0, 8, 2}));  // 4 rows per block in 8 parts
}

TEST_CASE("a part's placement says where each of its elements lies in the whole tensor", "[shards]") {
  const auto places = [](const exec::PartPlacement& placement, uint64_t count) {
    std::vector<uint64_t> whole;
    for (uint64_t i = 0; i < count; ++i) whole.push_back(placement.whole_index(i));
    return whole;
  };
  // fc1 [8, 2] as [gate; up], rank 1 of 2: gate rows 2-3 (elements 4-7), up rows 6-7 (12-15).
  CHECK(places(exec::part_placement({8, 2}, {0, 1, 2, 2}), 8) == std::vector<uint64_t>{4, 5, 6, 7, 12, 13, 14, 15});
  // Row-parallel [3, 4], part 1 of 2: columns 2-3 of every row.
  CHECK(places(exec::part_placement({3, 4}, {1, 1, 2}), 6) == std::vector<uint64_t>{2, 3, 6, 7, 10, 11});
  // The whole tensor is one run.
  std::vector<uint64_t> identity(12);
  std::iota(identity.begin(), identity.end(), uint64_t{0});
  CHECK(places(exec::part_placement({3, 4}, {}), 12) == identity);
  CHECK_THROWS_AS(exec::part_placement({6, 2}, {0, 0, 4}), std::invalid_argument);  // 6 rows in 4 parts
}
