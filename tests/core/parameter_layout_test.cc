// Megatron DDP's contiguous layout: reverse registration order, every parameter aligned, buckets
// cut at parameter boundaries once they reach the bucket size, padded to the data-parallel size,
// and the shared embedding alone in its bucket.
#include <catch2/catch.hpp>

#include "core/parameter_layout.h"

using megaplan::layout_parameters;

TEST_CASE("parameters are laid out in reverse, aligned, in buckets padded to the data-parallel size", "[layout]") {
  // Registered sizes 100, 3, 50, 70: the backward produces the 70 first, so it comes first.
  const auto layout = layout_parameters({100, 3, 50, 70}, 128, 3);
  CHECK(layout.offsets == std::vector<std::size_t>{256, 192, 128, 0});  // each at a multiple of 64
  REQUIRE(layout.buckets.size() == 2);
  // The 70 at 0, the 50 at 128 ending at 178 >= 128: a bucket of 178, padded to 180.
  CHECK(layout.buckets[0].offset == 0);
  CHECK(layout.buckets[0].size == 180);
  CHECK(layout.buckets[0].first_parameter == 2);
  CHECK(layout.buckets[0].last_parameter == 3);
  CHECK(layout.buckets[0].shard_size(3) == 60);
  // The 3 at 192 and the 100 at 256 end at 356: 176 elements from 180, padded to 177.
  CHECK(layout.buckets[1].offset == 180);
  CHECK(layout.buckets[1].size == 177);
  CHECK(layout.buckets[1].first_parameter == 0);
  CHECK(layout.buckets[1].last_parameter == 1);
  CHECK(layout.total == 357);
}

TEST_CASE("a shared embedding gets a bucket of its own", "[layout]") {
  const auto layout = layout_parameters({10, 3, 5, 7}, 1000, 2, {0});
  REQUIRE(layout.buckets.size() == 2);
  CHECK(layout.buckets[0].first_parameter == 1);
  CHECK(layout.buckets[0].last_parameter == 3);
  CHECK(layout.buckets[0].size == 132);  // the 3 at 128 ends at 131, padded to 132
  CHECK(layout.buckets[1].first_parameter == 0);
  CHECK(layout.buckets[1].last_parameter == 0);
  CHECK(layout.offsets[0] == 192);
  CHECK(layout.buckets[1].offset == 132);
  CHECK(layout.buckets[1].size == 70);
  CHECK(layout.total == 202);
}

TEST_CASE("routed experts' parameters get buckets of their own, padded to the expert data-parallel size", "[layout]") {
  // Registered: a dense 10, two experts' 20 and 30, a dense 5; dp 4, expert dp 3. The backward
  // produces the 5 first; the experts' pair ends that bucket and opens one of its own.
  const auto layout = layout_parameters({10, 20, 30, 5}, 1000, 4, {}, {false, true, true, false}, 3);
  REQUIRE(layout.buckets.size() == 3);
  CHECK_FALSE(layout.buckets[0].expert);
  CHECK(layout.buckets[0].first_parameter == 3);
  CHECK(layout.buckets[0].size == 8);  // the 5, padded to 4's multiple
  CHECK(layout.buckets[1].expert);
  CHECK(layout.buckets[1].first_parameter == 1);
  CHECK(layout.buckets[1].last_parameter == 2);
  CHECK(layout.offsets[2] == 64);        // the bucket starts at 8; the 30 aligned to 64
  CHECK(layout.offsets[1] == 128);       // the 20 after it, aligned
  CHECK(layout.buckets[1].size == 141);  // from 8 to 148, padded to 3's multiple
  CHECK_FALSE(layout.buckets[2].expert);
  CHECK(layout.buckets[2].first_parameter == 0);
  CHECK(layout.buckets[2].offset == 149);
  CHECK(layout.offsets[0] == 192);
  CHECK(layout.buckets[2].size == 56);  // 149 .. 202, padded to 4's multiple: 53 -> 56
  CHECK(layout.total == 205);
}
