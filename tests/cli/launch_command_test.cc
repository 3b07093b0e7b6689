// `megaplan launch`'s flags: torchrun's names, and everything after `--` left to the command.
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <catch2/catch.hpp>

#include "cli/commands.h"

namespace megaplan::cli {

TEST_CASE("launch flags: torchrun's names and everything after --", "[launch_command]") {
  // Only commands that fail validation here: a valid one would start this test binary as its ranks.
  std::ostringstream out;
  CommandContext context{out};
  CLI::App app{"test"};
  setup_launch_command(app, context);

  SECTION("underscore spellings as torchrun's") {
    CHECK_THROWS_WITH(app.parse("launch --nproc_per_node 0 -- presets", false),
                      "--nproc-per-node: must be at least 1, got 0");
  }
  SECTION("--nnodes needs --master-addr, and an empty one is refused") {
    CHECK_THROWS_WITH(app.parse("launch --nnodes 2 --node-rank 1 -- presets", false),
                      "--master-addr: --nnodes 2 needs rank 0's host name or address, the same on every node");
    // As argv holds it (CLI11 parses a vector from the back); a quoted "" in one string is lost.
    std::vector<std::string> arguments = {"launch",        "--nnodes", "2",  "--node_rank", "1",
                                          "--master_addr", "",         "--", "presets"};
    std::reverse(arguments.begin(), arguments.end());
    CHECK_THROWS_WITH(app.parse(arguments), "--master-addr: must name rank 0's host, got an empty string");
  }
  SECTION("options after -- belong to the command") {
    CHECK_THROWS_WITH(app.parse("launch --nproc-per-node 2 -- launch --model gpt2-124m", false),
                      Catch::Matchers::StartsWith("command: `launch` would start launchers"));
  }
}

}  // namespace megaplan::cli
