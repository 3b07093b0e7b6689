// `megaplan groups`: maps the flags onto megatron_rank_groups() and prints the result.
#include "cli/groups_command.h"

#include <memory>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/rank_groups.h"
#include "reports/rank_groups_report.h"

namespace megaplan::cli {

int run_groups(const GroupsOptions& options, std::ostream& out) {
  const RankGroups groups = megatron_rank_groups(options.world_size, options.tp, options.pp, options.cp, options.ep,
                                                 options.order, options.etp);
  if (options.json) {
    out << rank_groups_to_json(groups).dump(2) << '\n';
  } else {
    write_rank_groups_text(groups, out);
  }
  return 0;
}

void setup_groups_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<GroupsOptions>();
  CLI::App* command =
      app.add_subcommand("groups", "Print the rank groups Megatron-LM builds for a world size and parallel layout.");
  command->add_option("--world-size", options->world_size, "Number of ranks (GPUs)")->required();
  command->add_option("--tp,--tensor-model-parallel-size", options->tp, "Tensor-parallel size")->capture_default_str();
  command->add_option("--pp,--pipeline-model-parallel-size", options->pp, "Pipeline-parallel size")
      ->capture_default_str();
  command->add_option("--cp,--context-parallel-size", options->cp, "Context-parallel size")->capture_default_str();
  command->add_option("--ep,--expert-model-parallel-size", options->ep, "Expert-parallel size (MoE layers)")
      ->capture_default_str();
  command->add_option("--etp,--expert-tensor-parallel-size", options->etp,
                      "Expert tensor-parallel size (MoE layers; default: tp)");
  command
      ->add_option("--order", options->order,
                   "Rank order, fastest-varying first: names from tp, cp, ep, dp, pp joined by '-'")
      ->capture_default_str();
  command->add_flag("--json", options->json, "Print one JSON object keyed by group kind");
  command->callback([options, &context] { context.exit_code = run_groups(*options, context.out); });
}

}  // namespace megaplan::cli
