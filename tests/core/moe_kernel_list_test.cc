// The load an MoE plan states (core/moe_kernel_list.h): the busiest expert at imbalance x the mean,
// the rest even, capacity caps and padding; and the kernels that follow from a load.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>

#include "core/moe_kernel_list.h"

namespace {

using megaplan::Kernel;
using megaplan::KernelKind;
using megaplan::MoeDims;
using megaplan::MoeLoad;

// 8 experts, top 2, 64 tokens: 128 routes, 16 an expert at balance.
MoeDims eight_experts(int64_t expert_parallel, int64_t capacity = 0, bool pad = false) {
  MoeDims dims = megaplan::moe_dims(64, 32, 48, 0, false, 8, 2, capacity, pad, expert_parallel);
  dims.aux_loss = dims.z_loss = true;
  return dims;
}

int64_t count_of(const std::vector<Kernel>& kernels, KernelKind kind) {
  return std::count_if(kernels.begin(), kernels.end(), [&](const Kernel& k) { return k.kind == kind; });
}

}  // namespace

TEST_CASE("the stated load puts imbalance x the mean on the busiest expert and shares the rest", "[moe]") {
  const MoeLoad balanced = megaplan::moe_stated_load(eight_experts(1), 1.0);
  CHECK(balanced.dispatched == std::vector<int64_t>(8, 16));
  CHECK(balanced.received.empty());
  const MoeLoad skewed = megaplan::moe_stated_load(eight_experts(1), 2.0);
  CHECK(skewed.dispatched.front() == 32);
  CHECK(skewed.dispatched_rows() == 128);  // every route still dispatched: 96 over 7, 14 or 13 rows
  CHECK(*std::min_element(skewed.dispatched.begin() + 1, skewed.dispatched.end()) == 13);
  CHECK(*std::max_element(skewed.dispatched.begin() + 1, skewed.dispatched.end()) == 14);
  // At most every token: experts / top k = 4 is the largest imbalance.
  CHECK(megaplan::moe_stated_load(eight_experts(1), 4.0).dispatched.front() == 64);
  // A capacity caps the busiest expert (ceil(128 / 8 x 1.25) = 20); padding fills every expert to it.
  CHECK(megaplan::moe_stated_load(eight_experts(1, 20), 2.0).dispatched.front() == 20);
  CHECK(megaplan::moe_stated_load(eight_experts(1, 20, true), 2.0).dispatched == std::vector<int64_t>(8, 20));
}

TEST_CASE("under expert parallelism the stated rank holds the busiest expert and every member routes alike", "[moe]") {
  const MoeDims dims = eight_experts(4);  // two experts a rank
  const MoeLoad load = megaplan::moe_stated_load(dims, 2.0);
  CHECK(load.received == std::vector<int64_t>{32, 14, 32, 14, 32, 14, 32, 14});
  CHECK(load.local_rows(2) == std::vector<int64_t>{128, 56});
  CHECK(load.expert_rows(2) == 184);
  // Its experts' GEMMs are over their rows; its all-to-alls carry the larger of sent (128 rows) and received.
  const megaplan::MoeKernels kernels = megaplan::moe_kernels(dims, load, 2);
  using megaplan::CollectiveOp;
  using megaplan::MoeCollective;
  using megaplan::MoeGroup;
  const MoeCollective exchange{MoeGroup::kExpert, CollectiveOp::kAllToAll, 184 * 32 * 2};
  CHECK(kernels.forward_collectives ==
        std::vector<MoeCollective>{{MoeGroup::kExpert, CollectiveOp::kAllGather, 4 * 4 * 8}, exchange, exchange});
  CHECK(kernels.backward_collectives == std::vector<MoeCollective>{exchange, exchange});
  CHECK(count_of(kernels.forward, KernelKind::kGemm) == 1 + 2 + 2);  // router, two experts' fc1 and fc2
  CHECK(count_of(kernels.forward, KernelKind::kCopy) == 2 * 8);      // each sender's run regrouped, both ways
  CHECK(std::find(kernels.forward.begin(), kernels.forward.end(),
                  megaplan::gemm_kernel(megaplan::GemmLayout::kForward, megaplan::GemmEpilogue::kNone, 128, 96, 32)) !=
        kernels.forward.end());
  // The backward: each expert's two GEMMs twice, the router's two; the z and switch losses' gradients.
  CHECK(count_of(kernels.backward, KernelKind::kGemm) == 2 * 2 * 2 + 2);
  CHECK(count_of(kernels.backward, KernelKind::kMoeSwitchLossGradient) == 1);
  CHECK(count_of(kernels.backward, KernelKind::kMoeZLossGradient) == 1);
  // At ep 1 nothing travels.
  const megaplan::MoeKernels local =
      megaplan::moe_kernels(eight_experts(1), megaplan::moe_stated_load(eight_experts(1), 1), 2);
  CHECK(local.forward_collectives.empty());
  CHECK(local.backward_collectives.empty());
  CHECK(count_of(local.forward, KernelKind::kCopy) == 0);
}

TEST_CASE("under tensor parallelism the tp group gathers its members' arrived rows and computes a shard of each",
          "[moe]") {
  // tp 2 x ep 2, 8 experts (four an ep rank), each rank routing its 64 rows: its experts
  // compute what both ep members send both tp members, each member's room the most that arrived.
  MoeDims dims = megaplan::moe_dims(64, 32, 24, 16, false, 8, 2, 0, false, 2, 2);
  dims.aux_loss = true;
  const MoeLoad load = megaplan::moe_stated_load(dims, 2.0);
  CHECK(load.tensor_parallel == 2);
  CHECK(load.received.size() == 2 * 2 * 4);
  CHECK(load.room_rows(0) == 2 * (32 + 14 + 14 + 14));
  CHECK(load.arrived_rows() == load.room_rows(1));
  CHECK(load.expert_rows(4) == 2 * load.room_rows(0));
  const megaplan::MoeKernels kernels = megaplan::moe_kernels(dims, load, 2);
  using megaplan::CollectiveOp;
  using megaplan::MoeCollective;
  using megaplan::MoeGroup;
  const int64_t room_bytes = 2 * load.arrived_rows() * 32 * 2, shared_bytes = 2 * 64 * 32 * 2;
  const MoeCollective exchange{MoeGroup::kExpert, CollectiveOp::kAllToAll, load.room_rows(0) * 32 * 2};
  CHECK(kernels.forward_collectives ==
        std::vector<MoeCollective>{{MoeGroup::kTensor, CollectiveOp::kAllGather, shared_bytes},
                                   {MoeGroup::kExpert, CollectiveOp::kAllGather, 4 * 2 * 8},
                                   {MoeGroup::kTensor, CollectiveOp::kAllGather, 4 * 2 * 2 * 8},
                                   exchange,
                                   {MoeGroup::kTensor, CollectiveOp::kAllGather, room_bytes},
                                   {MoeGroup::kTensor, CollectiveOp::kReduceScatter, room_bytes},
                                   exchange,
                                   {MoeGroup::kTensor, CollectiveOp::kReduceScatter, shared_bytes},
                                   {MoeGroup::kTensor, CollectiveOp::kAllReduce, 4 * 8}});
  // Each expert's GEMMs over the group's rows at the rank's shard (24 wide); the shared expert over
  // the group's 128 rows, the router over the rank's 64.
  CHECK(std::find(kernels.forward.begin(), kernels.forward.end(),
                  megaplan::gemm_kernel(megaplan::GemmLayout::kForward, megaplan::GemmEpilogue::kNone, 2 * 2 * 32, 48,
                                        32)) != kernels.forward.end());
  CHECK(kernels.forward.front() ==
        megaplan::gemm_kernel(megaplan::GemmLayout::kForward, megaplan::GemmEpilogue::kNone, 64, 8, 32));
  CHECK(std::find(kernels.forward.begin(), kernels.forward.end(),
                  megaplan::gemm_kernel(megaplan::GemmLayout::kForward, megaplan::GemmEpilogue::kNone, 128, 32, 16)) !=
        kernels.forward.end());
  // Each (sender, expert) run regrouped both ways: 4 senders x 4 experts.
  CHECK(count_of(kernels.forward, KernelKind::kCopy) == 2 * 16);
}
