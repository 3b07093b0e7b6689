// Training under a launcher, without a GPU: where rank 0's rendezvous is, that every rank joins the
// same NCCL splits with consistent colors and keys (a rank that skipped one, or disagreed on a
// group, would hang the world), and that a process without NCCL or without a GPU refuses in one
// line before anything starts.
#include <catch2/catch.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/parallel_plan.h"
#include "executor/comm/mpi_bootstrap.h"
#include "executor/comm/nccl_comm.h"
#include "executor/gpu_inventory.h"
#include "executor/train/launched_training.h"
#include "executor/train/parallel_groups.h"
#include "tests/executor/train/training_fixtures.h"

namespace {

namespace exec = megaplan::exec;
using megaplan::ParallelPlan;
using megaplan::ScheduleKind;
using megaplan::SpecError;

exec::LaunchEnvironment launched(const std::string& launcher, int64_t world_size) {
  exec::LaunchEnvironment launch;
  launch.launcher = launcher;
  launch.world_size = world_size;
  launch.local_world_size = world_size;
  return launch;
}

std::optional<std::string> no_variables(const std::string&) { return std::nullopt; }

std::optional<std::string> agent_store(const std::string& name) {
  return name == "TORCHELASTIC_USE_AGENT_STORE" ? std::optional<std::string>("True") : std::nullopt;
}

// One split call as a rank made it.
struct SplitCall {
  int64_t color, key;
  std::vector<int64_t> ranks;
  std::string label;
};

// The splits every rank of `plan` makes while building its groups, by rank.
std::vector<std::vector<SplitCall>> splits_of(const ParallelPlan& plan) {
  std::vector<std::vector<SplitCall>> calls(static_cast<std::size_t>(plan.world_size()));
  for (int64_t rank = 0; rank < plan.world_size(); ++rank) {
    auto& mine = calls[static_cast<std::size_t>(rank)];
    exec::make_parallel_groups(
        plan, rank,
        exec::split_comm_factory(
            rank, [&mine](int64_t color, int64_t key, const std::vector<int64_t>& ranks, const std::string& label) {
              mine.push_back(SplitCall{color, key, ranks, label});
              return std::unique_ptr<exec::Comm>();
            }));
  }
  return calls;
}

ParallelPlan plan_of(int64_t tp, int64_t pp, int64_t dp, int64_t vpp, ScheduleKind schedule) {
  return megaplan::test::layout(tp, pp, dp, vpp, schedule, 1, 4 * dp);
}

}  // namespace

TEST_CASE("the rendezvous is at MASTER_ADDR, which a world of several needs", "[launch]") {
  exec::LaunchEnvironment torchrun = launched("torchrun", 4);
  torchrun.master_addr = "node7";
  torchrun.master_port = 29611;
  const exec::RendezvousAddress given = exec::rendezvous_address(torchrun, no_variables);
  CHECK(given.host == "node7");
  CHECK(given.port == 29611);
  // Real torchrun's agent holds MASTER_PORT for its own store; `megaplan launch` sets no such flag.
  CHECK(exec::rendezvous_address(torchrun, agent_store).port == 29612);
  torchrun.master_port = 65535;
  CHECK_THROWS_WITH(exec::rendezvous_address(torchrun, agent_store), Catch::StartsWith("MASTER_PORT: "));

  exec::LaunchEnvironment srun = launched("srun", 2);
  srun.master_addr = "node1";
  CHECK(exec::rendezvous_address(srun, no_variables).port == 29500);  // torch's default port

  // mpirun -np 1 sets neither; a world of one opens no socket.
  const exec::RendezvousAddress alone = exec::rendezvous_address(launched("mpirun", 1), no_variables);
  CHECK(alone.host == "127.0.0.1");
  CHECK(alone.port == 29500);

  CHECK_THROWS_MATCHES(exec::rendezvous_address(launched("mpirun", 2), no_variables), SpecError,
                       Catch::Message("MASTER_ADDR: mpirun started 2 processes but MASTER_ADDR is not set: rank 0's "
                                      "host must be named, with MASTER_PORT (default 29500), in every rank's "
                                      "environment"));
}

TEST_CASE("every rank joins the same splits, with one group per color and keys in group order", "[launch]") {
  const megaplan::ModelSpec model = [] {
    megaplan::ModelSpec tiny = megaplan::test::tiny_gpt();
    tiny.num_layers = 4;
    return tiny;
  }();
  struct Case {
    std::string name;
    ParallelPlan plan;
    std::vector<std::string> split_labels;  // the kinds split, in order
  };
  const std::vector<Case> cases = {
      {"one rank", plan_of(1, 1, 1, 1, ScheduleKind::kOneFOneB), {}},
      {"dp4", plan_of(1, 1, 4, 1, ScheduleKind::kOneFOneB), {"world", "dp"}},
      {"pp2 x dp2", plan_of(1, 2, 2, 1, ScheduleKind::kOneFOneB), {"world", "pp", "dp", "tp-pp", "embedding"}},
      // A V's first and last stage are both on pipeline rank 0: no embedding group.
      {"pp2 zbv", plan_of(1, 2, 1, 2, ScheduleKind::kZeroBubbleV), {"world", "pp", "tp-pp"}},
      {"tp2 x pp2 x dp2",
       plan_of(2, 2, 2, 1, ScheduleKind::kOneFOneB),
       {"world", "tp", "pp", "dp", "tp-pp", "embedding"}},
      // Gradients reduce over Megatron's dp-cp group, and the ring runs on cp's.
      {"tp2 x cp2 x pp2 x dp2",
       [] {
         ParallelPlan plan = plan_of(2, 2, 2, 1, ScheduleKind::kOneFOneB);
         plan.context_parallel_size = 2;
         return plan;
       }(),
       {"world", "tp", "pp", "dp-cp", "tp-pp", "embedding", "cp"}},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    megaplan::validate_plan(model, c.plan);
    const std::vector<std::vector<SplitCall>> calls = splits_of(c.plan);
    for (std::size_t rank = 0; rank < calls.size(); ++rank) {
      INFO("rank " << rank);
      REQUIRE(calls[rank].size() == c.split_labels.size());
      for (std::size_t s = 0; s < c.split_labels.size(); ++s) CHECK(calls[rank][s].label == c.split_labels[s]);
    }
    // Per split: the ranks sharing a color are exactly the group they all name, each keyed by its
    // position in it.
    for (std::size_t s = 0; s < c.split_labels.size(); ++s) {
      INFO("split " << c.split_labels[s]);
      std::map<int64_t, std::vector<int64_t>> members;  // color -> ranks in key order
      for (std::size_t rank = 0; rank < calls.size(); ++rank) {
        const SplitCall& call = calls[rank][s];
        if (call.color < 0) continue;
        REQUIRE(call.key >= 0);
        REQUIRE(call.key < static_cast<int64_t>(call.ranks.size()));
        CHECK(call.ranks[static_cast<std::size_t>(call.key)] == static_cast<int64_t>(rank));
        auto& group = members[call.color];
        if (group.empty()) group = call.ranks;
        CHECK(group == call.ranks);
      }
      int64_t covered = 0;
      for (const auto& [color, group] : members) covered += static_cast<int64_t>(group.size());
      // Every rank is in a group, except off the pipeline's ends for the embedding.
      if (c.split_labels[s] != "embedding") CHECK(covered == c.plan.world_size());
    }
  }
}

TEST_CASE("without NCCL or a GPU, a launched rank refuses in one line", "[launch]") {
  bool gpu_usable = megaplan::built_with_cuda();
  try {
    (void)megaplan::query_gpu_inventory();
  } catch (const SpecError&) {
    gpu_usable = false;
  }
  if (gpu_usable) {
    SUCCEED("a GPU is usable here: megaplan_gpu_tests' nccl_comm_test.cc runs the world");
    return;
  }
  try {
    const exec::IdBroadcast alone = [](const std::vector<uint8_t>& blob) { return blob; };
    (void)exec::make_nccl_world(0, 1, 0, alone, std::chrono::minutes(1));
    FAIL("make_nccl_world made a world without a GPU");
  } catch (const SpecError& error) {
    CHECK(error.field() == "--device");
    CHECK(std::string(error.what()).find('\n') == std::string::npos);
  }
}

namespace {

// A tiny GPT's dp 2 plan, trained as rank 0 of a world of 2 that `launcher` started, with no data
// path (what the options check would refuse after the rendezvous address).
void train_rank0_of_two(const std::string& launcher, std::ostringstream& out) {
  exec::TrainOptions options;
  options.train_iters = 1;
  (void)exec::train_launched(megaplan::test::tiny_gpt(), plan_of(1, 1, 2, 1, ScheduleKind::kOneFOneB), options,
                             launched(launcher, 2), out);
}

}  // namespace

TEST_CASE("a world of several without MASTER_ADDR is refused before any GPU is touched", "[launch]") {
  std::ostringstream out;
  CHECK_THROWS_WITH(train_rank0_of_two("srun", out), Catch::StartsWith("MASTER_ADDR: srun started 2 processes"));
  CHECK(out.str().empty());
}

TEST_CASE("under mpirun NCCL's id travels over MPI where megaplan has it, so MASTER_ADDR is not needed", "[launch]") {
  std::ostringstream out;
  if (!exec::mpi_bootstrap_available()) {
    CHECK_THROWS_WITH(train_rank0_of_two("mpirun", out), Catch::StartsWith("MASTER_ADDR: mpirun started 2 processes"));
    CHECK_THROWS_AS(exec::mpi_broadcast_from_rank0(0, 1, {1, 2, 3}), SpecError);
    return;
  }
  // No rendezvous address is looked for: what stops the run is the next check (the missing
  // --data-path), where srun's stops at MASTER_ADDR.
  CHECK_THROWS_WITH(train_rank0_of_two("mpirun", out), Catch::StartsWith("--data-path"));
}

TEST_CASE("a rank's context-parallel and replica ranks are its places in Megatron's cp and dp-cp groups", "[launch]") {
  // Megatron's order tp-cp-ep-dp-pp: tp fastest, then cp, then dp.
  ParallelPlan plan = plan_of(2, 1, 2, 1, ScheduleKind::kOneFOneB);
  plan.context_parallel_size = 2;
  for (int64_t rank = 0; rank < plan.world_size(); ++rank) {
    INFO("rank " << rank);
    const exec::ParallelGroups groups =
        exec::make_parallel_groups(plan, rank, [](const exec::GroupKind&) { return std::unique_ptr<exec::Comm>(); });
    CHECK(groups.tensor_parallel_rank == rank % 2);
    CHECK(groups.context_parallel_rank == rank / 2 % 2);
    CHECK(groups.data_parallel_rank == rank / 4);
    CHECK(groups.replica_rank == rank / 2);  // cp fastest within dp-cp: replica 0 is cp 0 of dp 0
  }
}
