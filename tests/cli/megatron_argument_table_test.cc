// core's table of Megatron-LM's arguments against Megatron's own parser (tests/data/
// megatron_arguments.tsv, recorded by tools/megatron_arguments.py) and against the commands: every
// argument has one row of the right arity, and every honoured row is a flag of each command it
// matters to, so the table cannot claim what the commands do not do.
#include <CLI/CLI.hpp>
#include <catch2/catch.hpp>

#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/unexpected_arguments.h"
#include "core/megatron_arguments.h"

namespace {

using megaplan::ArgumentArity;
using megaplan::ArgumentEffect;
using megaplan::ArgumentSupport;

std::string arity_name(ArgumentArity arity) {
  switch (arity) {
    case ArgumentArity::kSwitch: return "switch";
    case ArgumentArity::kOne: return "one";
    case ArgumentArity::kList: return "list";
    case ArgumentArity::kThree: return "three";
  }
  return "?";
}

// The long flags of one subcommand of the megaplan binary.
std::set<std::string> flags_of(const std::string& name) {
  static CLI::App app;
  static megaplan::cli::CommandContext context{std::cout};
  static const bool wired = [] {
    megaplan::cli::setup_describe_command(app, context);
    megaplan::cli::setup_search_command(app, context);
    megaplan::cli::setup_simulate_command(app, context);
    megaplan::cli::setup_train_command(app, context);
    return true;
  }();
  (void)wired;
  const std::vector<std::string> flags = megaplan::cli::long_flags(*app.get_subcommand(name));
  return {flags.begin(), flags.end()};
}

}  // namespace

TEST_CASE("the table holds every argument of Megatron-LM's parser, with its arity", "[cli][megatron]") {
  std::ifstream tsv(MEGAPLAN_TEST_DATA_DIR "/megatron_arguments.tsv");
  REQUIRE(tsv);
  std::size_t count = 0;
  for (std::string line; std::getline(tsv, line);) {
    std::istringstream fields(line);
    std::string flag, arity;
    std::getline(fields, flag, '\t');
    std::getline(fields, arity, '\t');
    INFO(flag);
    const megaplan::MegatronArgument* row = megaplan::find_megatron_argument(flag);
    REQUIRE(row != nullptr);
    CHECK(arity_name(row->arity) == arity);
    ++count;
  }
  CHECK(megaplan::megatron_arguments().size() == count);
}

TEST_CASE("every honoured row is a flag of each command it matters to", "[cli][megatron]") {
  const std::set<std::string> train = flags_of("train");
  // search chooses the uneven split and the recomputation's method itself.
  const std::set<std::string> search_chooses = {"--decoder-first-pipeline-num-layers",
                                                "--decoder-last-pipeline-num-layers",
                                                "--account-for-embedding-in-pipeline-split",
                                                "--account-for-loss-in-pipeline-split",
                                                "--recompute-method",
                                                "--recompute-num-layers"};
  for (const megaplan::MegatronArgument& row : megaplan::megatron_arguments()) {
    const std::string flag(row.flag);
    INFO(flag);
    switch (row.support) {
      case ArgumentSupport::kHonoured:
        CHECK(row.reason.empty());
        if (row.effect == ArgumentEffect::kRunAndCost || row.effect == ArgumentEffect::kCost) {
          CHECK(flags_of("simulate").count(flag) == 1);
          CHECK(flags_of("describe").count(flag) == 1);
          if (search_chooses.count(flag) == 0) CHECK(flags_of("search").count(flag) == 1);
        }
        if (row.effect == ArgumentEffect::kRunAndCost || row.effect == ArgumentEffect::kRun) {
          CHECK(train.count(flag) == 1);
        }
        break;
      case ArgumentSupport::kCosmetic:
        CHECK(row.effect == ArgumentEffect::kNothing);
        if (!row.accepted_values.empty()) CHECK(!row.reason.empty());
        break;
      case ArgumentSupport::kRefused:
        CHECK(!row.reason.empty());
        CHECK(row.effect != ArgumentEffect::kNothing);
        break;
    }
  }
}

TEST_CASE("did-you-mean: other tools' spellings, then the nearest flag", "[cli][megatron]") {
  const std::vector<std::string> simulate_own = {"--gpus", "--model"};
  const std::vector<std::string> train_own = {"--world-size", "--model"};
  CHECK(megaplan::nearest_megatron_flag("--tensor-parallel-size", simulate_own) == "--tensor-model-parallel-size");
  CHECK(megaplan::nearest_megatron_flag("--seq-len", simulate_own) == "--seq-length");
  CHECK(megaplan::nearest_megatron_flag("--num-gpus", simulate_own) == "--gpus");
  CHECK(megaplan::nearest_megatron_flag("--num-gpus", train_own) == "--world-size");
  CHECK(megaplan::nearest_megatron_flag("--lr-warmup-fractoin", simulate_own) == "--lr-warmup-fraction");
  CHECK(megaplan::nearest_megatron_flag("--modle", simulate_own) == "--model");
  CHECK(!megaplan::nearest_megatron_flag("--foo-bar", simulate_own));
  CHECK(!megaplan::nearest_megatron_flag("--xy", simulate_own));
}

TEST_CASE("cosmetic rows accept only the values megaplan runs", "[cli][megatron]") {
  const megaplan::MegatronArgument* backend = megaplan::find_megatron_argument("--distributed-backend");
  REQUIRE(backend != nullptr);
  CHECK(megaplan::accepts_value(*backend, "nccl"));
  CHECK(!megaplan::accepts_value(*backend, "gloo"));
  const megaplan::MegatronArgument* rerun = megaplan::find_megatron_argument("--rerun-mode");
  REQUIRE(rerun != nullptr);
  CHECK(megaplan::accepts_value(*rerun, "validate_results"));
  CHECK(!megaplan::accepts_value(*rerun, "report_stats"));
  CHECK(megaplan::accepts_value(*megaplan::find_megatron_argument("--tensorboard-dir"), "/anywhere"));
}
