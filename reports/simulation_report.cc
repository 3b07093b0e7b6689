#include "reports/simulation_report.h"

#include <algorithm>
#include <string>
#include <utility>

#include "core/implementation_options.h"
#include "core/pipeline_layout.h"
#include "core/text_table.h"
#include "core/units.h"
#include "reports/memory_table.h"
#include "simulator/profile_choice.h"

namespace megaplan {
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

}  // namespace

nlohmann::json simulation_json(const JobSpec& job, const sim::Profile& profile, const sim::PlanSimulation& simulation) {
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
          {"model_tflops_per_gpu", simulation.rates.model_tflops_per_gpu},
          {"hardware_tflops_per_gpu", simulation.rates.hardware_tflops_per_gpu},
          {"mfu", simulation.rates.mfu},
          {"bubble_fraction", simulation.result.bubble_fraction},
          {"peak_memory_bytes", simulation.peak_memory_bytes},
          {"memory_capacity_bytes", simulation.memory_capacity_bytes},
          {"fits_in_memory", simulation.fits_in_memory},
          {"memory_shortfall_bytes", shortfall},
          {"fullest_stage", rank},
          {"profile", sim::profile_json(profile)},
          {"kernel_times", {{"from_tables", simulation.sources.table}, {"from_roofline", simulation.sources.fallback}}},
          {"events", simulation.result.events},
          {"stages", std::move(stages)}};
}

void write_simulation_text(const JobSpec& job, const sim::Profile& profile, const sim::PlanSimulation& simulation,
                           std::ostream& out) {
  const ParallelPlan& plan = job.plan;
  const sim::SimulationResult& result = simulation.result;
  out << job.model.name << " on " << plan.world_size() << " x " << job.cluster.gpu.name << ": " << describe_plan(plan)
      << " (" << plan.num_microbatches() << " microbatches per replica)\n";
  const double tokens = static_cast<double>(plan.global_batch_size * job.model.seq_length);
  out << "iteration  " << seconds(result.iteration_time_s) << " s, " << format_count(tokens / result.iteration_time_s)
      << " tokens/s\n";
  out << "compute    " << seconds(simulation.rates.model_tflops_per_gpu) << " model TFLOP/s per GPU ("
      << seconds(simulation.rates.hardware_tflops_per_gpu) << " with recomputation), MFU "
      << format_percent(simulation.rates.mfu) << " of " << format_flops(job.cluster.gpu.dense_bf16_flops_per_s)
      << "/s dense bf16\n";
  out << "bubble     " << format_percent(result.bubble_fraction) << " of the pipeline's span\n";
  out << "code       " << describe_implementation(plan) << "\n";
  const auto [rank, shortfall] = fullest_rank(simulation);
  out << "memory     peak " << format_gib(static_cast<double>(simulation.peak_memory_bytes)) << " (pipeline rank "
      << rank << ") of " << format_gib(static_cast<double>(simulation.memory_capacity_bytes)) << ": "
      << (simulation.fits_in_memory ? "fits" : "does not fit, short by " + format_gib(static_cast<double>(shortfall)))
      << "\n";
  const int64_t lookups = simulation.sources.table + simulation.sources.fallback;
  out << "profile    " << sim::describe_profile(profile) << "\n           " << simulation.sources.fallback << " of "
      << lookups << " kernel times from a fallback (the roofline, or entries of a nearby kind)\n\n";

  TextTable table(
      {"rank", "compute s", "tp/cp/ep comm s", "pp comm s", "dp comm s", "idle s", "in-flight", "memory GiB"});
  for (std::size_t r = 0; r < result.ranks.size(); ++r) {
    const sim::RankSimulation& times = result.ranks[r];
    const PipelineRankMemory& memory = simulation.memory[r];
    table.add_row({std::to_string(r), seconds(times.compute_s), seconds(times.collective_s),
                   seconds(times.pipeline_comm_s), seconds(times.data_parallel_comm_s), seconds(times.idle_s),
                   std::to_string(memory.peak_inflight_microbatches), gib(memory.total_bytes)});
  }
  out << table.render();
  out << "\nmemory per pipeline rank at its peak, GiB (activations: the schedule's in-flight microbatches; "
         "transient: one microbatch's logits or a recomputed layer)\n"
      << memory_table(simulation.memory);
}

}  // namespace megaplan
