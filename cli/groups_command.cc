// `megaplan groups`: maps the flags onto megatron_rank_groups() and prints the result.
#include "cli/groups_command.h"

#include <algorithm>
#include <memory>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/rank_groups.h"

namespace megaplan::cli {
namespace {

void write_group(const std::vector<int64_t>& group, std::ostream& out) {
  out << '[';
  for (size_t i = 0; i < group.size(); ++i) {
    if (i > 0) out << ", ";
    out << group[i];
  }
  out << ']';
}

void write_text(const RankGroups& groups, std::ostream& out) {
  out << "Megatron rank groups for world " << groups.world_size << ": tp " << groups.tensor_parallel_size << ", pp "
      << groups.pipeline_parallel_size << ", cp " << groups.context_parallel_size << ", ep "
      << groups.expert_parallel_size << ", dp " << groups.data_parallel_size << ", expert dp "
      << groups.expert_data_parallel_size << "; order";
  for (size_t i = 0; i < groups.order.size(); ++i) out << (i == 0 ? " " : "-") << groups.order[i];
  out << '\n';

  size_t name_width = 0;
  for (const auto& [kind, list] : groups.kinds) name_width = std::max(name_width, kind.size());
  for (const auto& [kind, list] : groups.kinds) {
    out << kind << std::string(name_width + 2 - kind.size(), ' ');
    for (size_t i = 0; i < list.size(); ++i) {
      if (i > 0) out << ' ';
      write_group(list[i], out);
    }
    out << '\n';
  }
}

}  // namespace

int run_groups(const GroupsOptions& options, std::ostream& out) {
  const RankGroups groups =
      megatron_rank_groups(options.world_size, options.tp, options.pp, options.cp, options.ep, options.order);
  if (options.json) {
    out << rank_groups_to_json(groups).dump(2) << '\n';
  } else {
    write_text(groups, out);
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
  command
      ->add_option("--order", options->order,
                   "Rank order, fastest-varying first: names from tp, cp, ep, dp, pp joined by '-'")
      ->capture_default_str();
  command->add_flag("--json", options->json, "Print one JSON object keyed by group kind");
  command->callback([options, &context] { context.exit_code = run_groups(*options, context.out); });
}

}  // namespace megaplan::cli
