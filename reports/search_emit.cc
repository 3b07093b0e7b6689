// search --emit's outputs.
#include "reports/search_emit.h"

#include <utility>
#include <vector>

#include "core/error.h"
#include "planner/launch_commands.h"
#include "planner/megatron_arguments.h"
#include "planner/torchtitan_config.h"

namespace megaplan {
namespace {

// The best plan's launch lines: its job file is --out's (job.json when none), which also carries
// the overlaps the simulation assumed (its implementation options).
std::vector<planner::LaunchCommand> launch_commands_for(const JobSpec& job,
                                                        const std::optional<std::string>& job_file) {
  return planner::launch_commands(job.plan, job.cluster, job_file.value_or("job.json"),
                                  "--data-path DATA_PREFIX --train-iters ITERS");
}

}  // namespace

void check_emit(const std::string& emit, const std::string& implementation) {
  if (emit != "megatron" && emit != "launch" && emit != "torchtitan") {
    throw SpecError("--emit", "knows \"megatron\", \"torchtitan\" and \"launch\", got \"" + emit + "\"");
  }
  if (emit == "launch" && implementation != "megaplan") {
    throw SpecError("--emit", "launch prints lines that start megaplan train, which runs megaplan's executor, not " +
                                  implementation + "'s code; --emit megatron prints Megatron-LM's arguments");
  }
}

void add_emitted_json(nlohmann::json& json, const std::string& emit, const JobSpec& job,
                      const std::optional<std::string>& job_file) {
  if (emit == "megatron") json["megatron_arguments"] = planner::megatron_arguments(job.model, job.plan);
  if (emit == "torchtitan") json["torchtitan_config"] = planner::torchtitan_config(job.model, job.plan);
  if (emit == "launch") {
    nlohmann::json commands = nlohmann::json::array();
    for (const planner::LaunchCommand& command : launch_commands_for(job, job_file)) {
      commands.push_back({{"launcher", command.launcher}, {"note", command.note}, {"command", command.command}});
    }
    json["launch_commands"] = std::move(commands);
  }
}

void write_emitted_text(const std::string& emit, const JobSpec& job, const std::string& picked,
                        const std::optional<std::string>& job_file, std::ostream& out) {
  if (emit == "megatron") {
    out << "\nMegatron-LM arguments for " << picked << ":\n"
        << planner::format_megatron_arguments(planner::megatron_arguments(job.model, job.plan));
  }
  if (emit == "torchtitan") {
    out << "\ntorchtitan config module for " << picked << ":\n" << planner::torchtitan_config(job.model, job.plan);
  }
  if (emit == "launch") {
    out << "\nLaunch " << picked << " ("
        << (job_file ? "the job file --out wrote" : "write the job file with --out job.json")
        << "; DATA_PREFIX and ITERS are yours):\n";
    out << planner::format_launch_commands(launch_commands_for(job, job_file));
  }
}

}  // namespace megaplan
