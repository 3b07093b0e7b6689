// Megatron-LM's process groups (tp, pp, dp, cp, ep, their combinations, and the embedding groups)
// listed exactly as megatron/core/parallel_state.py builds them, so that the executor's NCCL
// communicators and the planner's reports name the same ranks that Megatron would put together.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace megaplan {

// One list per group; each group lists global ranks in Megatron's order (not necessarily sorted).
using RankGroupList = std::vector<std::vector<int64_t>>;

// Megatron's default order: tensor-parallel ranks are adjacent, pipeline stages are farthest apart.
inline constexpr std::string_view kDefaultParallelOrder = "tp-cp-ep-dp-pp";

// The dimension names an order string may use.
inline constexpr std::array<std::string_view, 5> kParallelDimensions = {"tp", "cp", "ep", "dp", "pp"};

// The group kinds megatron_rank_groups() lists, in this order (also the JSON key order).
// "tp-pp" is Megatron's model-parallel group.
// "expert-tp" is the expert layers' tensor-parallel group (Megatron's expert tensor-parallel group:
// the tp groups when --expert-tensor-parallel-size is tp), "tp-ep" their tensor-and-expert one.
inline constexpr std::array<std::string_view, 15> kRankGroupKinds = {
    "tp",        "pp",    "dp",        "cp",        "dp-cp",
    "tp-pp",     "tp-dp", "tp-dp-cp",  "tp-cp",     "ep",
    "expert-tp", "tp-ep", "expert-dp", "embedding", "position-embedding"};

// Largest world megatron_rank_groups() lists: every rank appears in every kind, so a typo such as
// --world-size 10000000000 would otherwise allocate without bound.
inline constexpr int64_t kMaxRankGroupWorldSize = int64_t{1} << 20;

// Splits an order string such as "tp-cp-ep-dp-pp" into its names, lower-cased (Megatron lower-cases
// it too). Throws SpecError("--order", ...) for an unknown or empty name or a name given twice.
// Names left out are not appended here; RankGenerator does that, because only it knows their sizes.
std::vector<std::string> parse_parallel_order(const std::string& order);

// The rank grid of Megatron's generate_masked_orthogonal_rank_groups: dimension i has size
// sizes[i], the first dimension varies fastest (rank = sum of index[i] * prefix product of sizes),
// and each group varies the masked dimensions while the unmasked ones stay fixed. Groups are
// listed with the first unmasked dimension varying fastest; inside a group, the first masked
// dimension varies fastest.
// REQUIRES: sizes.size() == mask.size(); every size > 0; the product of sizes == world_size.
// Violations are programming errors and throw std::invalid_argument.
RankGroupList masked_orthogonal_rank_groups(int64_t world_size, const std::vector<int64_t>& sizes,
                                            const std::vector<bool>& mask);

// Megatron's RankGenerator: a rank grid over the five dimensions laid out in `order`.
// Names left out of the order are appended at its end, and must have size 1.
// Current Megatron-Core builds two of them over the same world: a "decoder" (dense layers) one with
// ep = 1, and an "expert" (MoE layers) one with cp = 1; a generator never has both ep and cp > 1.
class RankGenerator {
 public:
  // `name` says which generator this is in error messages ("decoder", "expert").
  // Throws SpecError("--order", ...) when the order is malformed or leaves out a name whose size
  // is not 1.
  // REQUIRES: every size > 0, their product fits in 64 bits, and ep == 1 or cp == 1
  // (std::invalid_argument otherwise).
  RankGenerator(std::string name, int64_t tp, int64_t ep, int64_t dp, int64_t pp, int64_t cp, const std::string& order);

  const std::string& name() const { return name_; }
  // The full order, with the names left out of the given order appended.
  const std::vector<std::string>& order() const { return order_; }
  int64_t world_size() const { return world_size_; }
  int64_t size_of(std::string_view dimension) const;

  // The groups spanned by the dimensions in `token` ("tp", "tp-dp-cp", ...; the names' order in
  // the token does not matter). Throws std::invalid_argument for a name not in the order.
  RankGroupList get_ranks(std::string_view token) const;

 private:
  std::string name_;
  std::vector<std::string> order_;
  std::vector<int64_t> ordered_sizes_;
  int64_t world_size_ = 1;
};

// Every kind of kRankGroupKinds for one layout, with the sizes it was derived from.
struct RankGroups {
  int64_t world_size = 0;
  int64_t tensor_parallel_size = 1;
  int64_t pipeline_parallel_size = 1;
  int64_t context_parallel_size = 1;
  int64_t expert_parallel_size = 1;
  int64_t expert_tensor_parallel_size = 1;
  int64_t data_parallel_size = 1;         // world / (tp * pp * cp): the dense layers' replicas
  int64_t expert_data_parallel_size = 1;  // world / (etp * ep * pp): the expert layers' replicas
  std::vector<std::string> order;         // the full order, names left out appended

  // In kRankGroupKinds order.
  std::vector<std::pair<std::string, RankGroupList>> kinds;

  bool contains(std::string_view kind) const;
  // Throws std::out_of_range naming the kind when it is not one of kRankGroupKinds.
  const RankGroupList& at(std::string_view kind) const;
};

// The rank groups Megatron-Core's initialize_model_parallel() creates for this layout, with the
// expert tensor-parallel size `expert_tensor_parallel_size` (0: tp, Megatron's default).
//
// Which generator each kind comes from (as in parallel_state.py):
//   decoder generator (tp, cp, ep = 1, dp = world/(tp*pp*cp), pp):
//     tp, pp, dp, cp, dp-cp, tp-pp, tp-dp, tp-dp-cp, tp-cp; embedding and position-embedding are
//     taken from its pp groups (first and last rank of each, one rank when pp = 1; first rank).
//   expert generator (etp, cp = 1, ep, dp = world/(etp*ep*pp), pp):
//     ep, expert-tp (its tp), tp-ep (Megatron's expert tensor-and-model group), expert-dp (its
//     expert data-parallel group: the ranks holding the same experts, over which their gradients
//     are summed).
//
// Every broken rule throws SpecError naming the CLI flag ("--world-size", "--tp", "--pp", "--cp",
// "--ep", "--etp", "--order") and the rule with its values: sizes must be positive, their products must fit
// in 64 bits, world <= kMaxRankGroupWorldSize, world divisible by tp*pp*cp and by etp*ep*pp, a valid
// order, and Megatron's two expert checks: when the order does not end in pp and pp > 1, the expert
// data-parallel size must equal the data-parallel size; and both generators must give the same
// pipeline groups.
//
// Unlike Megatron-Core before its expert generator was split off, ep and dp need not be adjacent in
// the order: current Megatron no longer checks it, and its own --use-tp-pp-dp-mapping order
// "tp-cp-ep-pp-dp" separates them.
RankGroups megatron_rank_groups(int64_t world_size, int64_t tensor_parallel_size, int64_t pipeline_parallel_size,
                                int64_t context_parallel_size = 1, int64_t expert_parallel_size = 1,
                                const std::string& order = std::string(kDefaultParallelOrder),
                                int64_t expert_tensor_parallel_size = 0);

// One object keyed by kind (kRankGroupKinds order), each a list of rank lists.
nlohmann::ordered_json rank_groups_to_json(const RankGroups& groups);

}  // namespace megaplan
