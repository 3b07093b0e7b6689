// `megaplan simulate`: flag mapping and the text and JSON reports.
#include "cli/simulate_command.h"

#include <algorithm>
#include <iostream>
#include <memory>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "executor/io/staged_file.h"
#include "cli/commands.h"
#include "cli/notes.h"
#include "cli/pasted_arguments.h"
#include "cli/profile_choice.h"
#include "cli/report_command.h"
#include "core/error.h"
#include "core/executor_support.h"
#include "core/pipeline_layout.h"
#include "core/schedule/lowering.h"
#include "core/schedule/schedule_csv.h"
#include "core/schedule/validation.h"
#include "reports/chrome_trace.h"
#include "reports/memory_table.h"
#include "reports/text_table.h"
#include "core/units.h"
#include "simulator/simulate_plan.h"

namespace megaplan::cli {
namespace {

std::string seconds(double value) { return format_significant(value, 4); }

std::string gib(int64_t bytes) { return gib_number(static_cast<double>(bytes)); }

// The rank whose memory is fullest, and by how much it overflows (0 when it fits).
std::pair<int64_t, int64_t> fullest_rank(const sim::PlanSimulation& simulation) {
  int64_t rank = 0;
  for (const PipelineRankMemory& memory : simulation.memory) {
    if (memory.total_bytes == simulation.peak_memory_bytes) rank = memory.pipeline_rank;
  }
  return {rank, std::max<int64_t>(0, simulation.peak_memory_bytes - simulation.memory_capacity_bytes)};
}

nlohmann::json to_json(const JobSpec& job, const sim::Profile& profile, const sim::PlanSimulation& simulation) {
  nlohmann::json stages = nlohmann::json::array();
  for (std::size_t rank = 0; rank < simulation.result.ranks.size(); ++rank) {
    const sim::RankSimulation& times = simulation.result.ranks[rank];
    const PipelineRankMemory& memory = simulation.memory[rank];
    stages.push_back({{"stage", rank},
                      {"virtual_stages", stages_of_pipeline_rank(static_cast<int64_t>(rank), job.plan)},
                      {"peak_memory_bytes", memory.total_bytes},
                      {"activation_bytes", memory.activation_bytes},
                      {"runtime_reserve_bytes", memory.runtime_reserve_bytes},
                      {"peak_inflight_microbatches", memory.peak_inflight_microbatches},
                      {"compute_s", times.compute_s},
                      {"exposed_comm_s", times.exposed_comm_s()},
                      {"collective_s", times.collective_s},
                      {"pipeline_comm_s", times.pipeline_comm_s},
                      {"data_parallel_comm_s", times.data_parallel_comm_s},
                      {"idle_s", times.idle_s}});
  }
  const auto [rank, shortfall] = fullest_rank(simulation);
  return {{"schedule", to_string(job.plan.schedule)},
          {"implementation", to_string(job.plan.implementation)},
          {"implementation_options", implementation_options_to_json(job.plan.options)},
          {"iteration_time_s", simulation.result.iteration_time_s},
          {"model_tflops_per_gpu", simulation.model_tflops_per_gpu},
          {"hardware_tflops_per_gpu", simulation.hardware_tflops_per_gpu},
          {"mfu", simulation.mfu},
          {"bubble_fraction", simulation.result.bubble_fraction},
          {"peak_memory_bytes", simulation.peak_memory_bytes},
          {"memory_capacity_bytes", simulation.memory_capacity_bytes},
          {"fits_in_memory", simulation.fits_in_memory},
          {"memory_shortfall_bytes", shortfall},
          {"fullest_stage", rank},
          {"profile", profile_json(profile)},
          {"kernel_times", {{"from_tables", simulation.sources.table}, {"from_roofline", simulation.sources.fallback}}},
          {"events", simulation.result.events},
          {"stages", std::move(stages)}};
}

void write_text(const JobSpec& job, const sim::Profile& profile, const sim::PlanSimulation& simulation,
                std::ostream& out) {
  const ParallelPlan& plan = job.plan;
  const sim::SimulationResult& result = simulation.result;
  out << job.model.name << " on " << plan.world_size() << " x " << job.cluster.gpu.name << ": " << describe_plan(plan)
      << " (" << plan.num_microbatches() << " microbatches per replica)\n";
  const double tokens = static_cast<double>(plan.global_batch_size * job.model.seq_length);
  out << "iteration  " << seconds(result.iteration_time_s) << " s, "
      << format_count(tokens / result.iteration_time_s) << " tokens/s\n";
  out << "compute    " << seconds(simulation.model_tflops_per_gpu) << " model TFLOP/s per GPU ("
      << seconds(simulation.hardware_tflops_per_gpu) << " with recomputation), MFU " << format_percent(simulation.mfu)
      << " of " << format_flops(job.cluster.gpu.dense_bf16_flops_per_s) << "/s dense bf16\n";
  out << "bubble     " << format_percent(result.bubble_fraction) << " of the pipeline's span\n";
  out << "code       " << describe_implementation(plan) << "\n";
  const auto [rank, shortfall] = fullest_rank(simulation);
  out << "memory     peak " << format_gib(static_cast<double>(simulation.peak_memory_bytes)) << " (pipeline rank "
      << rank << ") of " << format_gib(static_cast<double>(simulation.memory_capacity_bytes)) << ": "
      << (simulation.fits_in_memory ? "fits"
                                    : "does not fit, short by " + format_gib(static_cast<double>(shortfall)))
      << "\n";
  const int64_t lookups = simulation.sources.table + simulation.sources.fallback;
  out << "profile    " << describe_profile(profile) << "\n           " << simulation.sources.fallback << " of "
      << lookups << " kernel times from the roofline fallback\n\n";

  TextTable table({"rank", "compute s", "tp/cp comm s", "pp comm s", "dp comm s", "idle s", "in-flight", "memory GiB"});
  for (std::size_t r = 0; r < result.ranks.size(); ++r) {
    const sim::RankSimulation& times = result.ranks[r];
    const PipelineRankMemory& memory = simulation.memory[r];
    table.add_row({std::to_string(r), seconds(times.compute_s), seconds(times.collective_s),
                   seconds(times.pipeline_comm_s), seconds(times.data_parallel_comm_s), seconds(times.idle_s),
                   std::to_string(memory.peak_inflight_microbatches),
                   gib(memory.total_bytes)});
  }
  out << table.render();
  out << "\nmemory per pipeline rank at its peak, GiB (activations: the schedule's in-flight microbatches; "
         "transient: one microbatch's logits or a recomputed layer)\n"
      << memory_table(simulation.memory);
}

}  // namespace

int run_simulate(const SimulateOptions& options, std::ostream& out) {
  const JobSpec job = load_job(options.model, options.cluster, options.plan, options.plan_file, options.given);
  // Costed all the same (the plan is legal), but megaplan's own executor would refuse to train it.
  if (job.plan.implementation == Implementation::kMegaplan) {
    for (const std::optional<SpecError>& refusal : {executor_model_refusal(job.model), executor_plan_refusal(job.plan)}) {
      if (refusal) note("megaplan train cannot run this plan yet: " + std::string(refusal->what()));
    }
  }
  const sim::Profile profile = choose_profile(options.profile, job.cluster.gpu);
  std::optional<PipelineSchedule> imported;
  if (options.schedule_csv) {
    imported = read_plan_schedule_csv(*options.schedule_csv, job.plan, "--schedule-csv");
    validate_schedule(lower_schedule(*imported));  // one that would hang is refused, as train refuses it
  }
  const sim::PlanSimulation simulation = sim::simulate_plan(job, profile, sim::Topology(job.cluster),
                                                            options.trace || options.report, imported ? &*imported : nullptr);
  if (options.trace) {
    nlohmann::json trace = timeline_to_chrome_trace(simulation.result.timeline, job, options.trace_detail);
    trace["otherData"]["profile"] = describe_profile(profile);  // what costed the slices
    exec::write_file_atomically(*options.trace, trace.dump() + "\n");
  }
  if (options.json) {
    out << to_json(job, profile, simulation).dump(2) << "\n";
  } else {
    write_text(job, profile, simulation, out);
  }
  // After the output: --json's stays one JSON document on stdout, the report's line goes to stderr.
  if (options.report) write_report(plan_report(job, profile, simulation), *options.report, options.json ? std::cerr : out);
  return 0;
}

void setup_simulate_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<SimulateOptions>();
  CLI::App* command = app.add_subcommand(
      "simulate", "Simulate one plan: iteration time, TFLOP/s, MFU, bubble, communication, memory per stage");
  add_model_options(*command, options->model);
  add_cluster_options(*command, options->cluster);
  add_plan_options(*command, options->plan);
  command->add_option("--plan", options->plan_file, "Job JSON (as describe --out writes it) instead of the flags above");
  command->add_option("--profile", options->profile, kProfileFlagHelp);
  CLI::Option* trace =
      command->add_option("--trace", options->trace, "Write the simulated timeline as a Chrome trace (Perfetto) here");
  command->add_flag("--trace-detail", options->trace_detail,
                    "In the trace, each layer's tensor- and context-parallel collectives as slices of their own")
      ->needs(trace);
  command->add_option("--schedule-csv", options->schedule_csv,
                      "Cost this compute-only torch schedule CSV (torchtitan's pipeline_parallel_schedule_csv) instead "
                      "of the plan's generated schedule; it must have the plan's shape");
  command->add_flag("--json", options->json, "Print JSON instead of text");
  command->add_option("--report", options->report, "Write the plan's HTML report here (as `megaplan report`)");
  accept_megatron_arguments(*command);
  command->callback([options, command, &context] {
    options->given = given_flags(*command);
    apply_pasted_vocabulary(read_pasted_arguments(*command, Computes::kCost), options->model);
    context.exit_code = run_simulate(*options, context.out);
  });
}

}  // namespace megaplan::cli
