// Tests for core/rank_groups: Megatron's rank groups on hand-worked layouts, properties over many
// layouts, and every input rule's message. Expected lists are written out literally, derived by
// hand from parallel_state.py's algorithm (rank = sum of index * stride, first order name fastest).
#include "core/rank_groups.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace megaplan {
namespace {

using Expected = std::map<std::string, RankGroupList>;

// Singletons [[0], [1], ..., [n-1]]: written as a helper only because 16 one-element lists add
// nothing to read.
RankGroupList singletons(int64_t n) {
  RankGroupList groups;
  for (int64_t rank = 0; rank < n; ++rank) groups.push_back({rank});
  return groups;
}

void check_all_kinds(const RankGroups& groups, const Expected& expected) {
  REQUIRE(groups.kinds.size() == kRankGroupKinds.size());
  REQUIRE(expected.size() == kRankGroupKinds.size());
  for (size_t i = 0; i < kRankGroupKinds.size(); ++i) {
    const std::string kind(kRankGroupKinds[i]);
    INFO("kind " << kind);
    CHECK(groups.kinds[i].first == kind);
    CHECK(groups.kinds[i].second == expected.at(kind));
    CHECK(groups.at(kind) == expected.at(kind));
  }
}

TEST_CASE("rank groups: world 16, tp 4, pp 2 match the seed lists", "[rank_groups]") {
  const RankGroups groups = megatron_rank_groups(16, 4, 2);
  CHECK(groups.data_parallel_size == 2);
  CHECK(groups.expert_data_parallel_size == 2);
  CHECK(groups.order == std::vector<std::string>{"tp", "cp", "ep", "dp", "pp"});
  const RankGroupList tp = {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}};
  const RankGroupList dp = {{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}};
  const RankGroupList pp = {{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}};
  const RankGroupList tp_dp = {{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}};
  check_all_kinds(groups, {{"tp", tp},
                           {"pp", pp},
                           {"dp", dp},
                           {"cp", singletons(16)},
                           {"dp-cp", dp},
                           {"tp-pp", {{0, 1, 2, 3, 8, 9, 10, 11}, {4, 5, 6, 7, 12, 13, 14, 15}}},
                           {"tp-dp", tp_dp},
                           {"tp-dp-cp", tp_dp},
                           {"tp-cp", tp},
                           {"ep", singletons(16)},
                           {"expert-tp", tp},
                           {"tp-ep", tp},
                           {"expert-dp", dp},
                           {"embedding", pp},
                           {"position-embedding", {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}}});
}

TEST_CASE("rank groups: context parallel, world 16, tp 2, cp 2, pp 2", "[rank_groups]") {
  // Decoder grid tp2 cp2 ep1 dp2 pp2: rank = t + 2c + 4d + 8p. Expert grid tp2 cp1 ep1 dp4 pp2.
  const RankGroups groups = megatron_rank_groups(16, 2, 2, 2);
  CHECK(groups.data_parallel_size == 2);
  CHECK(groups.expert_data_parallel_size == 4);
  const RankGroupList tp = {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}};
  const RankGroupList pp = {{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}};
  check_all_kinds(groups, {{"tp", tp},
                           {"pp", pp},
                           {"dp", {{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}},
                           {"cp", {{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}},
                           {"dp-cp", {{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}},
                           {"tp-pp", {{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}},
                           {"tp-dp", {{0, 1, 4, 5}, {2, 3, 6, 7}, {8, 9, 12, 13}, {10, 11, 14, 15}}},
                           {"tp-dp-cp", {{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}},
                           {"tp-cp", {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}},
                           {"ep", singletons(16)},
                           {"expert-tp", tp},
                           {"tp-ep", tp},
                           {"expert-dp", {{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}},
                           {"embedding", pp},
                           {"position-embedding", {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}}});
}

TEST_CASE("rank groups: expert parallel, world 16, tp 2, ep 2, pp 2", "[rank_groups]") {
  // Decoder grid tp2 cp1 ep1 dp4 pp2: rank = t + 2d + 8p.
  // Expert grid tp2 cp1 ep2 dp2 pp2: rank = t + 2e + 4d + 8p.
  const RankGroups groups = megatron_rank_groups(16, 2, 2, 1, 2);
  CHECK(groups.data_parallel_size == 4);
  CHECK(groups.expert_data_parallel_size == 2);
  const RankGroupList tp = {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}};
  const RankGroupList pp = {{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}};
  const RankGroupList dp = {{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}};
  const RankGroupList tp_dp = {{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}};
  check_all_kinds(groups, {{"tp", tp},
                           {"pp", pp},
                           {"dp", dp},
                           {"cp", singletons(16)},
                           {"dp-cp", dp},
                           {"tp-pp", {{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}},
                           {"tp-dp", tp_dp},
                           {"tp-dp-cp", tp_dp},
                           {"tp-cp", tp},
                           {"ep", {{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}},
                           {"expert-tp", tp},
                           {"tp-ep", {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}},
                           {"expert-dp", {{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}},
                           {"embedding", pp},
                           {"position-embedding", {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}}});
}

TEST_CASE("rank groups: expert tensor parallelism 1 under tp 2, world 16, ep 4, pp 2", "[rank_groups]") {
  // Decoder grid tp2 cp1 ep1 dp4 pp2: rank = t + 2d + 8p. Expert grid etp1 cp1 ep4 dp2 pp2 (the
  // experts whole, their groups across the dense layers' tp pairs): rank = e + 4d + 8p.
  const RankGroups groups = megatron_rank_groups(16, 2, 2, 1, 4, std::string(kDefaultParallelOrder), 1);
  CHECK(groups.data_parallel_size == 4);
  CHECK(groups.expert_tensor_parallel_size == 1);
  CHECK(groups.expert_data_parallel_size == 2);
  const RankGroupList tp = {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}};
  const RankGroupList pp = {{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}};
  const RankGroupList dp = {{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}};
  const RankGroupList tp_dp = {{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}};
  const RankGroupList ep = {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}};
  check_all_kinds(groups, {{"tp", tp},
                           {"pp", pp},
                           {"dp", dp},
                           {"cp", singletons(16)},
                           {"dp-cp", dp},
                           {"tp-pp", {{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}},
                           {"tp-dp", tp_dp},
                           {"tp-dp-cp", tp_dp},
                           {"tp-cp", tp},
                           {"ep", ep},
                           {"expert-tp", singletons(16)},
                           {"tp-ep", ep},
                           {"expert-dp", {{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}},
                           {"embedding", pp},
                           {"position-embedding", {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}}});
  // etp 4 over tp 2 (the experts cut wider than the dense layers): expert grid etp4 ep1 dp2 pp2.
  const RankGroups wider = megatron_rank_groups(16, 2, 2, 1, 1, std::string(kDefaultParallelOrder), 4);
  CHECK(wider.at("expert-tp") == ep);
  CHECK(wider.at("expert-dp") == RankGroupList{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}});
  CHECK_THROWS_WITH(megatron_rank_groups(16, 2, 2, 1, 4, std::string(kDefaultParallelOrder), 4),
                    Catch::Contains("divisible by etp*ep*pp = 32"));
}

TEST_CASE("rank groups: order tp-cp-ep-pp-dp, world 16, tp 2, pp 4", "[rank_groups]") {
  // Megatron's --use-tp-pp-dp-mapping order. Grid tp2 cp1 ep1 pp4 dp2: rank = t + 2p + 8d.
  const RankGroups groups = megatron_rank_groups(16, 2, 4, 1, 1, "tp-cp-ep-pp-dp");
  CHECK(groups.data_parallel_size == 2);
  CHECK(groups.order == std::vector<std::string>{"tp", "cp", "ep", "pp", "dp"});
  const RankGroupList tp = {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}};
  const RankGroupList dp = {{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}};
  const RankGroupList tp_dp = {{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}};
  check_all_kinds(groups, {{"tp", tp},
                           {"pp", {{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}},
                           {"dp", dp},
                           {"cp", singletons(16)},
                           {"dp-cp", dp},
                           {"tp-pp", {{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}},
                           {"tp-dp", tp_dp},
                           {"tp-dp-cp", tp_dp},
                           {"tp-cp", tp},
                           {"ep", singletons(16)},
                           {"expert-tp", tp},
                           {"tp-ep", tp},
                           {"expert-dp", dp},
                           {"embedding", {{0, 6}, {1, 7}, {8, 14}, {9, 15}}},
                           {"position-embedding", {{0}, {1}, {8}, {9}}}});
}

TEST_CASE("rank groups: ep and dp need not be adjacent (current Megatron-Core)", "[rank_groups]") {
  // World 8, tp 1, cp 2, ep 2, pp 2, order tp-cp-ep-pp-dp: dp = expert dp = 2, so Megatron's
  // pp-not-last check passes. Decoder grid tp1 cp2 ep1 pp2 dp2: rank = c + 2p + 4d.
  // Expert grid tp1 cp1 ep2 pp2 dp2: rank = e + 2p + 4d.
  const RankGroups groups = megatron_rank_groups(8, 1, 2, 2, 2, "tp-cp-ep-pp-dp");
  const RankGroupList pairs = {{0, 1}, {2, 3}, {4, 5}, {6, 7}};
  const RankGroupList pp = {{0, 2}, {1, 3}, {4, 6}, {5, 7}};
  const RankGroupList dp = {{0, 4}, {1, 5}, {2, 6}, {3, 7}};
  check_all_kinds(groups, {{"tp", singletons(8)},
                           {"pp", pp},
                           {"dp", dp},
                           {"cp", pairs},
                           {"dp-cp", {{0, 1, 4, 5}, {2, 3, 6, 7}}},
                           {"tp-pp", pp},
                           {"tp-dp", dp},
                           {"tp-dp-cp", {{0, 1, 4, 5}, {2, 3, 6, 7}}},
                           {"tp-cp", pairs},
                           {"ep", pairs},
                           {"expert-tp", singletons(8)},
                           {"tp-ep", pairs},
                           {"expert-dp", dp},
                           {"embedding", pp},
                           {"position-embedding", {{0}, {1}, {4}, {5}}}});
}

TEST_CASE("rank groups: pp = 1, world 8, tp 2", "[rank_groups]") {
  // Grid tp2 dp4: rank = t + 2d. Each pipeline group is one rank, so the embedding group is it.
  const RankGroups groups = megatron_rank_groups(8, 2, 1);
  const RankGroupList tp = {{0, 1}, {2, 3}, {4, 5}, {6, 7}};
  const RankGroupList dp = {{0, 2, 4, 6}, {1, 3, 5, 7}};
  const RankGroupList all = {{0, 1, 2, 3, 4, 5, 6, 7}};
  check_all_kinds(groups, {{"tp", tp},
                           {"pp", singletons(8)},
                           {"dp", dp},
                           {"cp", singletons(8)},
                           {"dp-cp", dp},
                           {"tp-pp", tp},
                           {"tp-dp", all},
                           {"tp-dp-cp", all},
                           {"tp-cp", tp},
                           {"ep", singletons(8)},
                           {"expert-tp", tp},
                           {"tp-ep", tp},
                           {"expert-dp", dp},
                           {"embedding", singletons(8)},
                           {"position-embedding", singletons(8)}});
}

TEST_CASE("rank groups: a single rank", "[rank_groups]") {
  const RankGroups groups = megatron_rank_groups(1, 1, 1);
  for (const auto& [kind, list] : groups.kinds) {
    INFO("kind " << kind);
    CHECK(list == RankGroupList{{0}});
  }
}

TEST_CASE("rank groups: the order is case-insensitive and names left out are appended", "[rank_groups]") {
  const RankGroups reference = megatron_rank_groups(16, 2, 2, 2, 2);
  CHECK(megatron_rank_groups(16, 2, 2, 2, 2, "TP-CP-EP-DP-PP").kinds == reference.kinds);

  // cp = ep = 1 may be left out; they are appended after pp (ep first, as Megatron does), where
  // size 1 changes nothing.
  const RankGroups short_order = megatron_rank_groups(16, 4, 2, 1, 1, "tp-dp-pp");
  CHECK(short_order.order == std::vector<std::string>{"tp", "dp", "pp", "ep", "cp"});
  CHECK(short_order.kinds == megatron_rank_groups(16, 4, 2).kinds);
}

TEST_CASE("rank groups: lookup by kind", "[rank_groups]") {
  const RankGroups groups = megatron_rank_groups(4, 2, 1);
  CHECK(groups.contains("tp-dp-cp"));
  CHECK_FALSE(groups.contains("tp-ep-pp"));
  CHECK(groups.at("tp") == RankGroupList{{0, 1}, {2, 3}});
  CHECK_THROWS_AS(groups.at("expert"), std::out_of_range);
  CHECK_THROWS_WITH(groups.at("expert"), Catch::Contains("\"expert\""));
}

TEST_CASE("rank groups: JSON is keyed by kind in kind order", "[rank_groups]") {
  const nlohmann::ordered_json json = rank_groups_to_json(megatron_rank_groups(4, 2, 2));
  std::vector<std::string> keys;
  for (const auto& item : json.items()) keys.push_back(item.key());
  CHECK(keys == std::vector<std::string>(kRankGroupKinds.begin(), kRankGroupKinds.end()));
  CHECK(json["tp"] == nlohmann::ordered_json::parse("[[0, 1], [2, 3]]"));
  CHECK(json["embedding"] == nlohmann::ordered_json::parse("[[0, 2], [1, 3]]"));
}

TEST_CASE("masked_orthogonal_rank_groups: Megatron's docstring example", "[rank_groups]") {
  // sizes [tp, dp, pp] = [2, 3, 4], mask picks dp: strides 1, 2, 6.
  CHECK(masked_orthogonal_rank_groups(24, {2, 3, 4}, {false, true, false}) ==
        RankGroupList{
            {0, 2, 4}, {1, 3, 5}, {6, 8, 10}, {7, 9, 11}, {12, 14, 16}, {13, 15, 17}, {18, 20, 22}, {19, 21, 23}});
  CHECK(masked_orthogonal_rank_groups(24, {2, 3, 4}, {true, false, true}) ==
        RankGroupList{{0, 1, 6, 7, 12, 13, 18, 19}, {2, 3, 8, 9, 14, 15, 20, 21}, {4, 5, 10, 11, 16, 17, 22, 23}});
  CHECK_THROWS_AS(masked_orthogonal_rank_groups(23, {2, 3, 4}, {true, false, false}), std::invalid_argument);
  CHECK_THROWS_AS(masked_orthogonal_rank_groups(6, {2, 3}, {true}), std::invalid_argument);
}

TEST_CASE("RankGenerator: tokens name dimensions in any order", "[rank_groups]") {
  const RankGenerator generator("decoder", 2, 1, 2, 2, 1, "tp-cp-ep-dp-pp");
  CHECK(generator.name() == "decoder");
  CHECK(generator.world_size() == 8);
  CHECK(generator.size_of("dp") == 2);
  CHECK(generator.get_ranks("dp-tp") == generator.get_ranks("tp-dp"));
  CHECK(generator.get_ranks("tp-dp") == RankGroupList{{0, 1, 2, 3}, {4, 5, 6, 7}});
  CHECK_THROWS_AS(generator.get_ranks("tp-xp"), std::invalid_argument);
  CHECK_THROWS_AS(RankGenerator("bad", 1, 2, 1, 1, 2, "tp-cp-ep-dp-pp"), std::invalid_argument);
  CHECK_THROWS_AS(RankGenerator("bad", 0, 1, 1, 1, 1, "tp-cp-ep-dp-pp"), std::invalid_argument);
}

// Every kind partitions the ranks into equal groups of the right size; the tp, cp, dp and pp
// groups through one rank meet only in that rank; embedding groups come from the pp groups.
void check_properties(const RankGroups& groups) {
  const int64_t world = groups.world_size;
  const int64_t tp = groups.tensor_parallel_size;
  const int64_t pp = groups.pipeline_parallel_size;
  const int64_t cp = groups.context_parallel_size;
  const int64_t ep = groups.expert_parallel_size;
  const int64_t dp = groups.data_parallel_size;
  const std::map<std::string, int64_t> group_sizes = {
      {"tp", tp},         {"pp", pp},         {"dp", dp},         {"cp", cp},
      {"dp-cp", dp * cp}, {"tp-pp", tp * pp}, {"tp-dp", tp * dp}, {"tp-dp-cp", tp * dp * cp},
      {"tp-cp", tp * cp}, {"ep", ep},         {"tp-ep", tp * ep}, {"expert-dp", groups.expert_data_parallel_size}};
  REQUIRE(tp * pp * cp * dp == world);
  REQUIRE(tp * ep * pp * groups.expert_data_parallel_size == world);

  for (const auto& [kind, size] : group_sizes) {
    INFO("kind " << kind);
    const RankGroupList& list = groups.at(kind);
    CHECK(static_cast<int64_t>(list.size()) == world / size);
    std::vector<int64_t> all;
    for (const auto& group : list) {
      CHECK(static_cast<int64_t>(group.size()) == size);
      all.insert(all.end(), group.begin(), group.end());
    }
    std::sort(all.begin(), all.end());
    std::vector<int64_t> expected(static_cast<size_t>(world));
    for (int64_t rank = 0; rank < world; ++rank) expected[static_cast<size_t>(rank)] = rank;
    CHECK(all == expected);
  }

  // The group of each kind that holds each rank.
  std::map<std::string, std::vector<std::set<int64_t>>> group_of;
  for (const std::string kind : {"tp", "cp", "dp", "pp"}) {
    group_of[kind].resize(static_cast<size_t>(world));
    for (const auto& group : groups.at(kind)) {
      for (const int64_t rank : group) {
        group_of[kind][static_cast<size_t>(rank)] = std::set<int64_t>(group.begin(), group.end());
      }
    }
  }
  for (int64_t rank = 0; rank < world; ++rank) {
    for (const std::string first : {"tp", "cp", "dp", "pp"}) {
      for (const std::string second : {"tp", "cp", "dp", "pp"}) {
        if (first == second) continue;
        std::vector<int64_t> common;
        const auto& a = group_of[first][static_cast<size_t>(rank)];
        const auto& b = group_of[second][static_cast<size_t>(rank)];
        std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(common));
        INFO(first << " and " << second << " groups of rank " << rank);
        CHECK(common == std::vector<int64_t>{rank});
      }
    }
  }

  const RankGroupList& stages = groups.at("pp");
  const RankGroupList& embedding = groups.at("embedding");
  const RankGroupList& position = groups.at("position-embedding");
  REQUIRE(embedding.size() == stages.size());
  REQUIRE(position.size() == stages.size());
  for (size_t i = 0; i < stages.size(); ++i) {
    const std::vector<int64_t> ends =
        pp == 1 ? std::vector<int64_t>{stages[i].front()} : std::vector<int64_t>{stages[i].front(), stages[i].back()};
    CHECK(embedding[i] == ends);
    CHECK(position[i] == std::vector<int64_t>{stages[i].front()});
  }
}

TEST_CASE("rank groups: properties over many layouts and every order", "[rank_groups]") {
  std::vector<std::string> names = {"cp", "dp", "ep", "pp", "tp"};  // sorted for next_permutation
  std::vector<std::string> orders;
  do {
    orders.push_back(names[0] + "-" + names[1] + "-" + names[2] + "-" + names[3] + "-" + names[4]);
  } while (std::next_permutation(names.begin(), names.end()));
  REQUIRE(orders.size() == 120);

  int checked = 0;
  int refused = 0;
  for (const int64_t world : {1, 2, 4, 6, 8, 12, 16}) {
    std::vector<int64_t> divisors;
    for (int64_t d = 1; d <= world; ++d) {
      if (world % d == 0) divisors.push_back(d);
    }
    for (const int64_t tp : divisors) {
      for (const int64_t pp : divisors) {
        for (const int64_t cp : divisors) {
          for (const int64_t ep : divisors) {
            if (world % (tp * pp * cp) != 0 || world % (tp * pp * ep) != 0) continue;
            for (const std::string& order : orders) {
              INFO("world " << world << " tp " << tp << " pp " << pp << " cp " << cp << " ep " << ep << " order "
                            << order);
              try {
                check_properties(megatron_rank_groups(world, tp, pp, cp, ep, order));
                ++checked;
              } catch (const SpecError& error) {
                // Only Megatron's two pipeline checks may refuse a divisible layout.
                CHECK(error.field() == "--order");
                CHECK_THAT(error.rule(), Catch::Contains("pipeline groups") || Catch::Contains("does not end in pp"));
                ++refused;
              }
            }
          }
        }
      }
    }
  }
  CHECK(checked > 10000);
  CHECK(refused > 0);
}

TEST_CASE("rank groups: default order accepts every divisible layout", "[rank_groups]") {
  // pp is last, so Megatron's pipeline checks always pass.
  for (const int64_t world : {8, 16, 24, 32}) {
    for (int64_t tp = 1; tp <= world; ++tp) {
      for (int64_t pp = 1; pp <= world; ++pp) {
        for (int64_t cp = 1; cp <= world; ++cp) {
          for (const int64_t ep : {1, 2, 4}) {
            if (world % (tp * pp * cp) != 0 || world % (tp * pp * ep) != 0) continue;
            INFO("world " << world << " tp " << tp << " pp " << pp << " cp " << cp << " ep " << ep);
            CHECK_NOTHROW(check_properties(megatron_rank_groups(world, tp, pp, cp, ep)));
          }
        }
      }
    }
  }
}

TEST_CASE("rank groups: sizes must be positive", "[rank_groups]") {
  CHECK_THROWS_WITH(megatron_rank_groups(0, 1, 1), Catch::Contains("--world-size: must be a positive integer, got 0"));
  CHECK_THROWS_WITH(megatron_rank_groups(-8, 1, 1),
                    Catch::Contains("--world-size: must be a positive integer, got -8"));
  CHECK_THROWS_WITH(megatron_rank_groups(8, 0, 1), Catch::Contains("--tp: must be a positive integer, got 0"));
  CHECK_THROWS_WITH(megatron_rank_groups(8, 1, -2), Catch::Contains("--pp: must be a positive integer, got -2"));
  CHECK_THROWS_WITH(megatron_rank_groups(8, 1, 1, 0), Catch::Contains("--cp: must be a positive integer, got 0"));
  CHECK_THROWS_WITH(megatron_rank_groups(8, 1, 1, 1, -1), Catch::Contains("--ep: must be a positive integer, got -1"));
}

TEST_CASE("rank groups: world size is bounded", "[rank_groups]") {
  CHECK_THROWS_WITH(megatron_rank_groups(int64_t{1} << 21, 1, 1),
                    Catch::Contains("--world-size: must be at most 1048576 to list every rank group, got 2097152"));
  CHECK_NOTHROW(megatron_rank_groups(int64_t{1} << 20, 32, 32, 32, 32));
}

TEST_CASE("rank groups: products that overflow 64 bits", "[rank_groups]") {
  const int64_t big = int64_t{1} << 40;
  CHECK_THROWS_WITH(megatron_rank_groups(16, big, big),
                    Catch::Contains("--pp: product 1099511627776 x 1099511627776 overflows 64 bits"));
  const int64_t half = int64_t{1} << 31;
  CHECK_THROWS_WITH(megatron_rank_groups(16, half, half, half),
                    Catch::Contains("--cp: product 4611686018427387904 x 2147483648 overflows 64 bits"));
  CHECK_THROWS_WITH(megatron_rank_groups(16, 4, 2, 1, int64_t{1} << 61),
                    Catch::Contains("--ep: product 8 x 2305843009213693952 overflows 64 bits"));
}

TEST_CASE("rank groups: world size must divide", "[rank_groups]") {
  CHECK_THROWS_WITH(megatron_rank_groups(16, 4, 3),
                    Catch::Contains("--world-size: must be divisible by tp*pp*cp = 12, got 16"));
  CHECK_THROWS_WITH(megatron_rank_groups(16, 2, 2, 6),
                    Catch::Contains("--world-size: must be divisible by tp*pp*cp = 24, got 16"));
  CHECK_THROWS_WITH(megatron_rank_groups(16, 2, 2, 1, 3),
                    Catch::Contains("--ep: the world size 16 must be divisible by etp*ep*pp = 12 "
                                    "for the expert layers, got ep = 3"));
  // Any ep with tp*ep*pp dividing the world is fine; here the expert data-parallel size is 1.
  CHECK_NOTHROW(megatron_rank_groups(16, 2, 2, 1, 4));
}

TEST_CASE("rank groups: order names must be known and unique", "[rank_groups]") {
  CHECK_THROWS_WITH(megatron_rank_groups(16, 4, 2, 1, 1, "tp-xp-dp-pp"),
                    Catch::Contains("--order: unknown name \"xp\" in \"tp-xp-dp-pp\"; an order "
                                    "joins names from tp, cp, ep, dp, pp with '-'"));
  CHECK_THROWS_WITH(megatron_rank_groups(16, 4, 2, 1, 1, ""), Catch::Contains("--order: unknown name \"\" in \"\""));
  CHECK_THROWS_WITH(megatron_rank_groups(16, 4, 2, 1, 1, "tp--pp"),
                    Catch::Contains("--order: unknown name \"\" in \"tp--pp\""));
  CHECK_THROWS_WITH(megatron_rank_groups(16, 4, 2, 1, 1, "tp-dp-tp-pp"),
                    Catch::Contains("--order: \"tp\" appears more than once in \"tp-dp-tp-pp\""));
  CHECK_THROWS_WITH(parse_parallel_order("tp,dp,pp"), Catch::Contains("--order: unknown name \"tp,dp,pp\""));
  CHECK(parse_parallel_order("Tp-Dp") == std::vector<std::string>{"tp", "dp"});
}

TEST_CASE("rank groups: names left out of the order must have size 1", "[rank_groups]") {
  CHECK_THROWS_WITH(megatron_rank_groups(16, 2, 2, 1, 1, "tp-pp"),
                    Catch::Contains("--order: \"tp-pp\" leaves out dp, whose size in the decoder "
                                    "rank generator is 4; a name left out of the order must have "
                                    "size 1"));
  CHECK_THROWS_WITH(megatron_rank_groups(16, 2, 2, 2, 1, "tp-dp-pp"),
                    Catch::Contains("--order: \"tp-dp-pp\" leaves out cp, whose size in the "
                                    "decoder rank generator is 2"));
  CHECK_THROWS_WITH(megatron_rank_groups(16, 2, 2, 1, 2, "tp-cp-dp-pp"),
                    Catch::Contains("--order: \"tp-cp-dp-pp\" leaves out ep, whose size in the "
                                    "expert rank generator is 2"));
  CHECK_THROWS_WITH(megatron_rank_groups(16, 2, 2, 1, 1, "tp-cp-ep-dp"),
                    Catch::Contains("--order: \"tp-cp-ep-dp\" leaves out pp, whose size in the "
                                    "decoder rank generator is 2"));
}

TEST_CASE("rank groups: Megatron's pipeline checks between dense and expert layers", "[rank_groups]") {
  // pp not last and pp > 1: dp = 16/(2*2*1) = 4 but expert dp = 16/(2*2*2) = 2.
  CHECK_THROWS_WITH(megatron_rank_groups(16, 2, 2, 1, 2, "tp-cp-ep-pp-dp"),
                    Catch::Contains("--order: \"tp-cp-ep-pp-dp\" does not end in pp and pp = 2 > 1, so the "
                                    "expert data-parallel size world/(etp*ep*pp) = 2 must equal the "
                                    "data-parallel size world/(tp*pp*cp) = 4"));
  // dp = expert dp = 2, but pp's stride is cp = 2 in the dense grid and 1 in the expert grid.
  CHECK_THROWS_WITH(megatron_rank_groups(8, 1, 2, 2, 2, "cp-pp-tp-ep-dp"),
                    Catch::Contains("--order: \"cp-pp-tp-ep-dp\" gives the dense layers pipeline groups "
                                    "[0, 2] [1, 3] [4, 6] ... but the expert layers [0, 1] [2, 3] [4, 5] ...; "
                                    "both must have the same pipeline groups"));
}

}  // namespace
}  // namespace megaplan
