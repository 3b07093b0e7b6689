// `megaplan launch`: the flags of executor/comm/launcher.h's run_launch, torchrun's spellings.
#include <iostream>
#include <memory>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "executor/comm/launcher.h"

namespace megaplan::cli {

void setup_launch_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<exec::LaunchOptions>();
  auto master_addr = std::make_shared<std::string>();
  CLI::App* command =
      app.add_subcommand("launch",
                         "Start this node's ranks as torchrun does: megaplan launch --nproc-per-node N -- train ...; "
                         "each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT");
  command->add_option("--nproc-per-node,--nproc_per_node", options->nproc_per_node, "Ranks on this node")
      ->capture_default_str();
  command->add_option("--nnodes", options->nnodes, "Nodes in the job")->capture_default_str();
  command->add_option("--node-rank,--node_rank", options->node_rank, "This node's index, 0..nnodes-1")
      ->capture_default_str();
  command->add_option("--master-addr,--master_addr", *master_addr,
                      "Rank 0's host (default 127.0.0.1; required with --nnodes > 1)");
  command->add_option("--master-port,--master_port", options->master_port, "Rank 0's TCP port")->capture_default_str();
  command->add_option("command", options->command,
                      "After --: the megaplan command every rank runs, with its arguments");
  command->callback([options, master_addr, command, &context] {
    if (command->count("--master-addr") > 0) options->master_addr = *master_addr;
    // The ranks run this very binary; /proc/self/exe stays right even if the file was replaced.
    context.exit_code = exec::run_launch(*options, "/proc/self/exe", std::cerr);
  });
}

}  // namespace megaplan::cli
