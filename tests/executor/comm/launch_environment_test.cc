// detect_launch_environment on injected environments: each launcher's set, the precedence of
// torchrun's, and every refusal with the variable it names.
#include "executor/comm/launch_environment.h"

#include <algorithm>
#include <map>
#include <string>

#include <catch2/catch.hpp>

#include "core/error.h"

using megaplan::SpecError;
using megaplan::exec::detect_launch_environment;
using megaplan::exec::LaunchEnvironment;

namespace {

using Variables = std::map<std::string, std::string>;

LaunchEnvironment detect(const Variables& variables) {
  return detect_launch_environment([&](const std::string& name) -> std::optional<std::string> {
    const auto found = variables.find(name);
    if (found == variables.end()) return std::nullopt;
    return found->second;
  });
}

// The SpecError's text ("FIELD: RULE"), or "" when detection succeeds.
std::string error_of(const Variables& variables) {
  try {
    detect(variables);
  } catch (const SpecError& error) {
    return error.what();
  }
  return "";
}

const Variables kTorchrun = {{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}};
const Variables kOpenMpi = {{"OMPI_COMM_WORLD_RANK", "3"},
                            {"OMPI_COMM_WORLD_SIZE", "8"},
                            {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
const Variables kSlurm = {{"SLURM_PROCID", "3"},
                          {"SLURM_NTASKS", "8"},
                          {"SLURM_LOCALID", "1"},
                          {"SLURM_NODEID", "1"},
                          {"SLURM_TASKS_PER_NODE", "2(x4)"}};

Variables merged(Variables base, const Variables& more) {
  for (const auto& [name, value] : more) base[name] = value;
  return base;
}

}  // namespace

TEST_CASE("no launcher: rank 0 of 1", "[launch]") {
  const LaunchEnvironment environment = detect({});
  CHECK(environment.launcher == "none");
  CHECK(environment.rank == 0);
  CHECK(environment.world_size == 1);
  CHECK(environment.local_rank == 0);
  CHECK(environment.local_world_size == 1);
  CHECK_FALSE(environment.master_addr);
  CHECK_FALSE(environment.master_port);
}

TEST_CASE("each launcher's set", "[launch]") {
  for (const auto& [launcher, variables] :
       {std::pair{"torchrun", kTorchrun}, std::pair{"mpirun", kOpenMpi}, std::pair{"srun", kSlurm}}) {
    INFO(launcher);
    const LaunchEnvironment environment =
        detect(merged(variables, {{"MASTER_ADDR", "node-0.cluster"}, {"MASTER_PORT", "29500"}}));
    CHECK(environment.launcher == launcher);
    CHECK(environment.rank == 3);
    CHECK(environment.world_size == 8);
    CHECK(environment.local_rank == 1);
    CHECK(environment.local_world_size == 2);
    CHECK(environment.master_addr == "node-0.cluster");
    CHECK(environment.master_port == 29500);
  }
}

TEST_CASE("Slurm's local size from its tasks-per-node layout", "[launch]") {
  // Nodes 0 and 1 run 4 tasks, node 2 runs 3: rank 9 is node 2's second task.
  Variables slurm = {{"SLURM_PROCID", "9"},
                     {"SLURM_NTASKS", "11"},
                     {"SLURM_LOCALID", "1"},
                     {"SLURM_NODEID", "2"},
                     {"SLURM_TASKS_PER_NODE", "4(x2),3"}};
  CHECK(detect(slurm).local_world_size == 3);
  slurm["SLURM_NODEID"] = "1";
  CHECK(detect(slurm).local_world_size == 4);
  slurm["SLURM_NODEID"] = "3";
  CHECK(error_of(slurm) == "SLURM_NODEID: 3 is beyond the 3 node(s) of SLURM_TASKS_PER_NODE=4(x2),3");
  slurm.erase("SLURM_NODEID");
  CHECK(error_of(slurm) ==
        "SLURM_NODEID: needed to pick this node's entry of SLURM_TASKS_PER_NODE=4(x2),3, but not set");
  slurm["SLURM_NTASKS_PER_NODE"] = "4";
  CHECK(detect(slurm).local_world_size == 4);
  slurm.erase("SLURM_TASKS_PER_NODE");
  CHECK(detect(slurm).local_world_size == 4);
  slurm.erase("SLURM_NTASKS_PER_NODE");
  CHECK_THAT(error_of(slurm), Catch::Matchers::StartsWith("SLURM_TASKS_PER_NODE: srun sets it"));
  slurm["SLURM_TASKS_PER_NODE"] = "4(x2";
  CHECK_THAT(error_of(slurm), Catch::Matchers::StartsWith("SLURM_TASKS_PER_NODE: want Slurm's layout"));
  slurm["SLURM_TASKS_PER_NODE"] = "6";  // uniform: no node id needed
  CHECK(detect(slurm).local_world_size == 6);
}

TEST_CASE("integers are decimal, in range, and do not overflow", "[launch]") {
  for (const char* bad : {"", "-1", "+1", " 1", "1 ", "07", "0x3", "3.0", "1e2", "three"}) {
    INFO(bad);
    CHECK(error_of(merged(kTorchrun, {{"RANK", bad}})) ==
          std::string("RANK: must be a decimal integer (digits only, no sign or leading zero), got \"") + bad + "\"");
  }
  CHECK(error_of(merged(kTorchrun, {{"WORLD_SIZE", "9223372036854775808"}})) ==
        "WORLD_SIZE: \"9223372036854775808\" overflows 64 bits");
  CHECK(error_of(merged(kTorchrun, {{"RANK", "8"}})) == "RANK: must be below WORLD_SIZE=8, got 8");
  CHECK(error_of(merged(kTorchrun, {{"WORLD_SIZE", "0"}, {"RANK", "0"}})) == "WORLD_SIZE: must be at least 1, got 0");
  CHECK(error_of(merged(kTorchrun, {{"LOCAL_RANK", "2"}})) == "LOCAL_RANK: must be below LOCAL_WORLD_SIZE=2, got 2");
  CHECK(error_of(merged(kTorchrun, {{"LOCAL_WORLD_SIZE", "16"}})) ==
        "LOCAL_WORLD_SIZE: must be between 1 and WORLD_SIZE=8, got 16");
  CHECK(error_of(merged(kOpenMpi, {{"OMPI_COMM_WORLD_LOCAL_RANK", "-0"}})) ==
        "OMPI_COMM_WORLD_LOCAL_RANK: must be a decimal integer (digits only, no sign or leading zero), "
        "got \"-0\"");
  // The largest value is fine where the ranges allow it.
  CHECK(detect(merged(kTorchrun, {{"WORLD_SIZE", "9223372036854775807"}})).world_size == 9223372036854775807);
}

TEST_CASE("a launcher's set must be complete", "[launch]") {
  CHECK(error_of({{"RANK", "0"}}) ==
        "WORLD_SIZE: torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE together; RANK is "
        "set but WORLD_SIZE is not");
  CHECK(error_of({{"LOCAL_RANK", "0"}}) ==
        "RANK: torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE together; LOCAL_RANK is "
        "set but RANK is not");
  Variables open_mpi = kOpenMpi;
  open_mpi.erase("OMPI_COMM_WORLD_LOCAL_SIZE");
  CHECK_THAT(error_of(open_mpi),
             Catch::Matchers::StartsWith("OMPI_COMM_WORLD_LOCAL_SIZE: mpirun sets OMPI_COMM_WORLD_RANK"));
  CHECK(error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}) ==
        "SLURM_LOCALID: srun sets SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID together; SLURM_PROCID is "
        "set but SLURM_LOCALID is not");
}

TEST_CASE("two launchers: agreeing, torchrun's wins; disagreeing, refused", "[launch]") {
  // mpirun starting torchrun-style variables for the same rank: torchrun's local layout is kept.
  const LaunchEnvironment both =
      detect(merged(kOpenMpi, merged(kTorchrun, {{"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "1"}})));
  CHECK(both.launcher == "torchrun");
  CHECK(both.rank == 3);
  CHECK(both.local_rank == 0);
  CHECK(both.local_world_size == 1);
  CHECK(detect(merged(kSlurm, kOpenMpi)).launcher == "mpirun");

  CHECK(error_of(merged(kTorchrun, {{"OMPI_COMM_WORLD_RANK", "1"},
                                    {"OMPI_COMM_WORLD_SIZE", "8"},
                                    {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                    {"RANK", "0"}})) ==
        "OMPI_COMM_WORLD_RANK: started by two launchers at once: OMPI_COMM_WORLD_RANK=1 but RANK=0; "
        "unset one set");
  CHECK(error_of(merged(kSlurm, merged(kTorchrun, {{"WORLD_SIZE", "4"}}))) ==
        "SLURM_NTASKS: started by two launchers at once: SLURM_NTASKS=8 but WORLD_SIZE=4; unset one set");
}

TEST_CASE("MASTER_ADDR and MASTER_PORT", "[launch]") {
  CHECK(detect({{"MASTER_ADDR", "::1"}}).master_addr == "::1");
  CHECK(detect({{"MASTER_PORT", "65535"}}).master_port == 65535);
  CHECK(error_of({{"MASTER_PORT", "0"}}) == "MASTER_PORT: must be a TCP port in 1..65535, got 0");
  CHECK(error_of({{"MASTER_PORT", "65536"}}) == "MASTER_PORT: must be a TCP port in 1..65535, got 65536");
  CHECK_THAT(error_of({{"MASTER_PORT", "0x7530"}}), Catch::Matchers::StartsWith("MASTER_PORT: must be a decimal"));
  CHECK_THAT(error_of({{"MASTER_ADDR", ""}}), Catch::Matchers::StartsWith("MASTER_ADDR: is set but empty"));
}

TEST_CASE("the variables a launcher strips cover every set", "[launch]") {
  const auto& names = megaplan::exec::launch_environment_variables();
  for (const char* name :
       {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
        "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_TASKS_PER_NODE", "MASTER_ADDR", "MASTER_PORT"}) {
    INFO(name);
    CHECK(std::find(names.begin(), names.end(), name) != names.end());
  }
}
