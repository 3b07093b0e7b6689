// Tests for `megaplan groups`: run_groups' JSON and text output, and the flag mapping.
#include "cli/groups_command.h"

#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"

namespace megaplan::cli {
namespace {

// world 16, tp 4, pp 2 as Megatron builds it (the seed's lists plus the embedding groups).
const char* const kExpectedJson = R"({
  "tp": [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]],
  "pp": [[0, 8], [1, 9], [2, 10], [3, 11], [4, 12], [5, 13], [6, 14], [7, 15]],
  "dp": [[0, 4], [1, 5], [2, 6], [3, 7], [8, 12], [9, 13], [10, 14], [11, 15]],
  "cp": [[0], [1], [2], [3], [4], [5], [6], [7], [8], [9], [10], [11], [12], [13], [14], [15]],
  "dp-cp": [[0, 4], [1, 5], [2, 6], [3, 7], [8, 12], [9, 13], [10, 14], [11, 15]],
  "tp-pp": [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]],
  "tp-dp": [[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15]],
  "tp-dp-cp": [[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15]],
  "tp-cp": [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]],
  "ep": [[0], [1], [2], [3], [4], [5], [6], [7], [8], [9], [10], [11], [12], [13], [14], [15]],
  "expert-tp": [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]],
  "tp-ep": [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]],
  "expert-dp": [[0, 4], [1, 5], [2, 6], [3, 7], [8, 12], [9, 13], [10, 14], [11, 15]],
  "embedding": [[0, 8], [1, 9], [2, 10], [3, 11], [4, 12], [5, 13], [6, 14], [7, 15]],
  "position-embedding": [[0], [1], [2], [3], [4], [5], [6], [7]]
})";

const std::vector<std::string> kKinds = {"tp",        "pp",    "dp",        "cp",        "dp-cp",
                                         "tp-pp",     "tp-dp", "tp-dp-cp",  "tp-cp",     "ep",
                                         "expert-tp", "tp-ep", "expert-dp", "embedding", "position-embedding"};

GroupsOptions world16_tp4_pp2() {
  GroupsOptions options;
  options.world_size = 16;
  options.tp = 4;
  options.pp = 2;
  return options;
}

TEST_CASE("groups --json: world 16, tp 4, pp 2", "[groups_command]") {
  GroupsOptions options = world16_tp4_pp2();
  options.json = true;
  std::ostringstream out;
  CHECK(run_groups(options, out) == 0);

  const nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(out.str());
  CHECK(parsed == nlohmann::ordered_json::parse(kExpectedJson));
  std::vector<std::string> keys;
  for (const auto& item : parsed.items()) keys.push_back(item.key());
  CHECK(keys == kKinds);
}

TEST_CASE("groups text: one line per kind", "[groups_command]") {
  std::ostringstream out;
  CHECK(run_groups(world16_tp4_pp2(), out) == 0);
  const std::string text = out.str();
  CHECK_THAT(text, Catch::StartsWith("Megatron rank groups for world 16: tp 4, pp 2, cp 1, ep 1, "
                                     "dp 2, expert dp 2; order tp-cp-ep-dp-pp\n"));

  std::istringstream lines(text);
  std::string line;
  std::getline(lines, line);  // header
  for (const std::string& kind : kKinds) {
    REQUIRE(std::getline(lines, line));
    INFO("line: " << line);
    CHECK_THAT(line, Catch::StartsWith(kind + " "));
  }
  CHECK_FALSE(std::getline(lines, line));

  CHECK_THAT(text, Catch::Contains("\ntp                  [0, 1, 2, 3] [4, 5, 6, 7] [8, 9, 10, 11] "
                                   "[12, 13, 14, 15]\n"));
  CHECK_THAT(text, Catch::Contains("\nposition-embedding  [0] [1] [2] [3] [4] [5] [6] [7]\n"));
  CHECK_THAT(text, Catch::Contains("\ntp-pp               [0, 1, 2, 3, 8, 9, 10, 11] "
                                   "[4, 5, 6, 7, 12, 13, 14, 15]\n"));
}

TEST_CASE("groups: bad input is a SpecError naming the flag", "[groups_command]") {
  GroupsOptions options = world16_tp4_pp2();
  options.pp = 3;
  std::ostringstream out;
  CHECK_THROWS_WITH(run_groups(options, out),
                    Catch::Contains("--world-size: must be divisible by tp*pp*cp = 12, got 16"));
  options.pp = 2;
  options.order = "tp-dp";
  CHECK_THROWS_AS(run_groups(options, out), SpecError);
  CHECK(out.str().empty());
}

TEST_CASE("groups: flags map onto the options", "[groups_command]") {
  std::ostringstream out;
  CommandContext context{out};
  CLI::App app{"test"};
  setup_groups_command(app, context);

  SECTION("long Megatron spellings") {
    app.parse(
        "groups --world-size 16 --tensor-model-parallel-size 4 "
        "--pipeline-model-parallel-size 2 --json",
        false);
    CHECK(context.exit_code == 0);
    CHECK(nlohmann::ordered_json::parse(out.str()) == nlohmann::ordered_json::parse(kExpectedJson));
  }
  SECTION("short spellings, cp, ep and order") {
    app.parse("groups --world-size 8 --tp 1 --pp 2 --cp 2 --ep 2 --order tp-cp-ep-pp-dp --json", false);
    const nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(out.str());
    CHECK(parsed["ep"] == nlohmann::ordered_json::parse("[[0, 1], [2, 3], [4, 5], [6, 7]]"));
    CHECK(parsed["pp"] == nlohmann::ordered_json::parse("[[0, 2], [1, 3], [4, 6], [5, 7]]"));
  }
  SECTION("--world-size is required") { CHECK_THROWS_AS(app.parse("groups --tp 2", false), CLI::RequiredError); }
}

}  // namespace
}  // namespace megaplan::cli
