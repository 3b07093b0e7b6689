// `megaplan search`: every legal layout of a model on a cluster at a global batch size, pruned by
// the memory model and ranked by simulated iteration time; a table, JSON, the best plan as a job
// file, Megatron-LM's arguments for it, and why it beats the runner-up.
// Flag mapping and the estimator wiring; the outputs are reports/search_report.h's.

#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/pasted_arguments.h"
#include "cli/progress_bar.h"
#include "cli/report_command.h"
#include "cli/shared_options.h"
#include "core/error.h"
#include "executor/io/staged_file.h"
#include "planner/search.h"
#include "planner/search_flags.h"
#include "planner/search_space.h"
#include "planner/torchtitan_config.h"
#include "planner/workers.h"
#include "reports/search_emit.h"
#include "reports/search_report.h"
#include "simulator/plan_estimator.h"
#include "simulator/profile_choice.h"

namespace megaplan::cli {
namespace {

struct SearchCommandOptions {
  ModelOptions model;
  ClusterOptions cluster;
  bool cluster_given = false;  // without --cluster and --gpus: the embedded default, 1024 A100-80GB
  int64_t global_batch_size = 1536;
  planner::SearchSpaceFlags space;
  int64_t top = 10;
  double memory_fraction = 0.9;
  int64_t threads = 0;
  std::optional<std::string> profile;
  std::optional<std::string> out;     // the picked plan (the best by default) as a job file (atomically)
  bool compare = false;               // --compare: every candidate costed, fitting or not, no pruning
  int64_t pick = 1;                   // --pick K: the ranked plan --out, --report and --emit take (1-based)
  std::optional<std::string> report;  // the best plan's HTML report, the ranked plans beside it
  std::optional<std::string> emit;    // "megatron" or "launch"
  bool explain = false;
  bool json = false;
};

constexpr int64_t kDefaultGpus = 1024;  // the embedded default: gpt3-175b on 1024 A100-80GB

int run_search(const SearchCommandOptions& options, std::ostream& out) {
  ClusterOptions cluster_options = options.cluster;
  if (!options.cluster_given && !cluster_options.gpus) cluster_options.gpus = kDefaultGpus;
  if (options.emit) check_emit(*options.emit, options.space.implementation.implementation);
  if (options.threads < 0)
    throw SpecError("--threads", "must be 0 (all cores) or more, got " + std::to_string(options.threads));
  JobSpec job{resolve_model(options.model), resolve_cluster(cluster_options), ParallelPlan{}};
  if (options.emit == "torchtitan") planner::require_torchtitan_model(job.model);

  planner::SearchProblem problem;
  problem.model = job.model;
  problem.gpus = job.cluster.total_gpus();
  problem.gpus_per_node = job.cluster.gpus_per_node;
  problem.global_batch_size = options.global_batch_size;
  problem.space = planner::search_space_from_flags(options.space, job.model);
  planner::validate_search_problem(problem);

  const sim::Profile profile = sim::choose_profile(options.profile, job.cluster.gpu);
  const sim::SimulatorEstimator estimator(job.model, job.cluster, profile);
  const auto start = std::chrono::steady_clock::now();
  const int64_t threads = planner::worker_count(options.threads);
  ProgressBar bar("searching");
  planner::SearchOptions search_options;
  search_options.top = options.top;
  search_options.memory_fraction = options.memory_fraction;
  search_options.threads = options.threads;
  search_options.tie_tolerance = profile.uncertainty();
  search_options.progress = [&bar](int64_t done, int64_t total) { bar.update(done, total); };
  search_options.problem = problem;  // when nothing fits, the error names the GPU count that would
  const planner::SearchResult result =
      options.compare ? planner::compare_plans(job.model, job.cluster.gpu, planner::enumerate_plans(problem, threads),
                                               estimator, search_options)
                      : planner::search_problem(problem, job.cluster.gpu, estimator, search_options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  if (options.pick < 1 || options.pick > static_cast<int64_t>(result.plans.size())) {
    throw SpecError("--pick", "must name one of the " + std::to_string(result.plans.size()) + " ranked plans (1.." +
                                  std::to_string(result.plans.size()) + "), got " + std::to_string(options.pick));
  }
  job.plan = result.plans[static_cast<std::size_t>(options.pick - 1)].plan;
  if (options.emit == "torchtitan") planner::require_torchtitan_plan(job.model, job.plan);
  if (options.out) exec::write_file_atomically(*options.out, job_spec_to_json(job).dump(2) + "\n");
  const SearchRun run{job, options.global_batch_size, options.top, seconds, threads, profile};
  nlohmann::json json = search_json(run, result, problem.space);
  if (options.report) {
    // The best plan's report with the ranked plans beside it; its line goes to stderr under --json.
    PlanReport report = plan_report(job, profile, sim::simulate_plan(job, profile, /*record_timeline=*/true));
    report.search = json;
    report.search_source = "the search";
    write_report(report, *options.report, options.json ? std::cerr : out);
  }
  if (options.json) {
    if (options.emit) add_emitted_json(json, *options.emit, job, options.out);
    out << json.dump(2) << "\n";
    return 0;
  }
  const std::string picked = "#" + std::to_string(options.pick);
  write_search_text(run, result, {.compare = options.compare, .explain = options.explain, .picked = picked}, out);
  if (options.emit) write_emitted_text(*options.emit, job, picked, options.out, out);
  return 0;
}

}  // namespace

void setup_search_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<SearchCommandOptions>();
  CLI::App* command = app.add_subcommand(
      "search", "Find the fastest layout that fits: enumerate, prune by memory, rank by simulated iteration time");
  add_model_options(*command, options->model);
  add_cluster_options(*command, options->cluster);
  const std::string group = "Search space (a value pins a dimension, a comma-separated list restricts it)";
  command->add_option("--gbs,--global-batch-size", options->global_batch_size, "Global batch size")
      ->capture_default_str()
      ->group(group);
  command->add_option("--tp,--tensor-model-parallel-size", options->space.tensor_parallel, "Tensor parallel sizes")
      ->delimiter(',')
      ->group(group);
  command
      ->add_option("--pp,--pipeline-model-parallel-size", options->space.pipeline_parallel, "Pipeline parallel sizes")
      ->delimiter(',')
      ->group(group);
  command
      ->add_option("--ep,--expert-model-parallel-size", options->space.expert_parallel,
                   "Expert parallel sizes (models with experts; default every size dividing the experts)")
      ->delimiter(',')
      ->group(group);
  command
      ->add_option("--etp,--expert-tensor-parallel-size", options->space.expert_tensor_parallel,
                   "Expert tensor parallel sizes (models with experts): megaplan cuts the experts over tp, so these "
                   "restrict tp")
      ->delimiter(',')
      ->group(group);
  command
      ->add_option("--moe-imbalance", options->space.moe_imbalance,
                   "The routed load every plan is costed at: the busiest expert's rows over the mean, as train logs "
                   "it (tokens_per_expert_max_mean); 1 is balanced")
      ->capture_default_str()
      ->group(group);
  command->add_option("--cp,--context-parallel-size", options->space.context_parallel, "Context parallel sizes")
      ->delimiter(',')
      ->group(group);
  command
      ->add_option("--vpp,--virtual-pipeline-model-parallel-size,--num-virtual-stages-per-pipeline-rank",
                   options->space.virtual_pipeline, "Model chunks per pipeline rank")
      ->delimiter(',')
      ->group(group);
  command
      ->add_option("--num-layers-per-virtual-pipeline-stage", options->space.layers_per_virtual_stage,
                   "Layers per model chunk (interleaved layouts only)")
      ->delimiter(',')
      ->group(group);
  command->add_option("--mbs,--micro-batch-size", options->space.micro_batch, "Micro-batch sizes")
      ->delimiter(',')
      ->group(group);
  command->add_option("--recompute-granularity", options->space.recompute, "none, selective, full")
      ->delimiter(',')
      ->group(group);
  command
      ->add_flag("--recompute-activations", options->space.recompute_activations,
                 "Megatron's alias of --recompute-granularity selective")
      ->group(group);
  command
      ->add_option("--schedule", options->space.schedules, "1f1b, interleaved, zb-h1, zbv, dualpipev (gpipe if listed)")
      ->delimiter(',')
      ->group(group);
  command->add_flag("--sequence-parallel", options->space.sequence_parallel, "Only layouts with sequence parallelism")
      ->group(group);
  command->add_flag("--no-sequence-parallel", options->space.no_sequence_parallel, "Only layouts without it")
      ->group(group);
  command
      ->add_flag("--use-distributed-optimizer", options->space.distributed_optimizer,
                 "Only layouts with the distributed optimizer")
      ->group(group);
  command->add_flag("--no-distributed-optimizer", options->space.no_distributed_optimizer, "Only layouts without it")
      ->group(group);
  command
      ->add_flag("--allow-cross-node-tp", options->space.allow_cross_node_tensor_parallel,
                 "Let tensor parallelism span nodes")
      ->group(group);
  add_implementation_options(*command, options->space.implementation);
  command->add_option("--memory-fraction", options->memory_fraction, "Fraction of HBM a plan may fill")
      ->capture_default_str();
  command->add_option("--top", options->top, "Plans to rank")->capture_default_str();
  command->add_option("--threads", options->threads, "Worker threads (0: all cores)")->capture_default_str();
  command->add_option("--profile", options->profile, sim::kProfileFlagHelp);
  command->add_option("--out", options->out, "Write the best plan as a job file (for simulate --plan)");
  command
      ->add_option("--pick", options->pick,
                   "The ranked plan --out, --report and --emit take: 1 (the best), 2, ... up to --top")
      ->capture_default_str();
  command->add_option("--report", options->report,
                      "Write the best plan's HTML report here, the ranked plans beside it");
  command->add_option(
      "--emit", options->emit,
      "Print the best plan as: megatron (Megatron-LM's arguments), torchtitan (a config module for torchtitan.train), "
      "launch (torchrun, srun, mpirun and megaplan launch lines)");
  command->add_flag("--explain", options->explain, "Say why the winner beats the runner-up, term by term");
  command->add_flag("--compare", options->compare,
                    "Cost every layout of the (pinned) space side by side, fitting or not: every schedule and vpp of "
                    "a pinned tp/pp/cp/mbs (at most 512 layouts)");
  command->add_flag("--json", options->json, "Print JSON: {\"plans\": [...], \"counts\": {...}}");
  accept_megatron_arguments(*command);
  command->callback([options, command, &context] {
    options->cluster_given = command->count("--cluster") > 0 || command->count("--gpus") > 0;
    apply_pasted_vocabulary(read_pasted_arguments(*command, Computes::kCost), options->model);
    context.exit_code = run_search(*options, context.out);
  });
}

}  // namespace megaplan::cli
