// `megaplan profile [--out FILE] [--quick]`: times the executor's own kernels on GPU 0 through the
// CUDA backend (executor/runtime/kernel_profiler.h) and writes a measured megaplan-profile/1 file
// (profiles/README.md) for `simulate --profile` and `search --profile`: the GPU's datasheet rates
// and roofline for what the tables do not cover, the measured GEMM, attention and element-wise
// tables, and the provenance (device, SMs, memory clock, driver, CUDA, cuBLAS, NCCL, megaplan,
// date, command). Without a usable GPU it says so and exits 2. With --import-nccl-tests FILE... it
// times nothing: the files' collectives and send/receive times join their GPU's profile
// (simulator/nccl_tests.h), which needs no GPU here. Where two GPUs or more are visible it also
// times NCCL's collectives and send/receive over them, and compute beside each
// (executor/runtime/collective_profiler.h); --links-only times just those and adds them to a
// profile of the GPU (--profile FILE, else the built-in one). With --transfer-to GPU it times nothing either:
// a measured profile (--profile FILE, else the built-in one simulate would transfer) becomes a
// transferred profile of that GPU (simulator/profile_transfer.h). With --leave-one-out it times
// nothing: it prints how well --profile's GEMM and attention tables interpolate between their points.
// Flag mapping, the GPU's identity and the measurements; the file format is
// simulator/profile_writer.h's.
#include <algorithm>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/progress_bar.h"
#include "core/device_gpu.h"
#include "core/error.h"
#include "core/text_table.h"
#include "core/units.h"
#include "executor/gpu_inventory.h"
#include "executor/gpu_inventory_report.h"
#include "executor/io/staged_file.h"
#include "executor/runtime/collective_profiler.h"
#include "executor/runtime/cuda_backend.h"
#include "executor/runtime/kernel_profiler.h"
#include "simulator/profile.h"
#include "simulator/profile_writer.h"

namespace megaplan::cli {
namespace {

struct ProfileOptions {
  std::optional<std::string> out;  // default: the JSON on stdout
  bool quick = false;
  // --links-only: time no kernels, only the links (two GPUs or more), added to --profile or the
  // GPU's built-in measured profile.
  bool links_only = false;
  // --import-nccl-tests: nccl-tests outputs measured elsewhere, added to a profile of their GPU
  // (--profile FILE, else its built-in measured profile, else its datasheet) instead of timing here.
  std::vector<std::string> nccl_tests;
  std::optional<std::string> profile;
  std::optional<std::string> transfer_to;  // a preset GPU's name (A100-SXM4-80GB, ...)
  bool leave_one_out = false;              // check --profile's interpolation instead of measuring
};

// --leave-one-out: each measured GEMM and attention point of --profile predicted from the others of
// its table; the errors per table, worst tables last.
int leave_one_out(const ProfileOptions& options, std::ostream& out) {
  if (!options.profile) throw SpecError("--leave-one-out", "checks a profile: pass --profile FILE");
  if (options.links_only || options.transfer_to || !options.nccl_tests.empty() || options.out) {
    throw SpecError("--leave-one-out",
                    "times and writes nothing; it cannot be combined with --links-only, "
                    "--transfer-to, --import-nccl-tests or --out");
  }
  std::vector<sim::InterpolationCheck> checks = sim::Profile::load(*options.profile).leave_one_out();
  std::stable_sort(
      checks.begin(), checks.end(),
      [](const sim::InterpolationCheck& a, const sim::InterpolationCheck& b) { return a.p95_error < b.p95_error; });
  TextTable table({"table", "points", "median", "p95", "max", "worst point"});
  for (const sim::InterpolationCheck& check : checks) {
    table.add_row({check.table, std::to_string(check.points), format_percent(check.median_error),
                   format_percent(check.p95_error), format_percent(check.max_error), check.worst});
  }
  out << "leave-one-out interpolation error of " << *options.profile
      << " (each point predicted from the rest of its table)\n"
      << table.render();
  return 0;
}

void write_profile(const ProfileOptions& options, const nlohmann::json& profile, std::ostream& out) {
  const std::string text = profile.dump(1) + "\n";
  if (options.out) {
    exec::write_file_atomically(*options.out, text);
  } else {
    out << text;
  }
}

// NCCL over every visible GPU (all of one type, one host: NVLink on the SXM boards).
CommTimings measure_links(const GpuInventory& inventory, bool quick) {
  const GpuDevice& device = inventory.devices.at(0);
  for (const GpuDevice& other : inventory.devices) {
    if (other.name != device.name) {
      throw SpecError("gpu", "the visible GPUs are of several types (" + device.name + ", " + other.name +
                                 "); set CUDA_VISIBLE_DEVICES to GPUs of one type");
    }
  }
  const auto gpus = static_cast<int64_t>(inventory.devices.size());
  ProgressBar bar("collectives over " + std::to_string(gpus) + " GPUs");
  return exec::measure_collectives_on_gpus(gpus, exec::collective_grid(quick, gpus),
                                           [&bar](int64_t done, int64_t total) { bar.update(done, total); });
}

// --links-only: the link tables measured here join a profile of this GPU (--profile FILE, else the
// built-in measured one), replacing the entries of the group sizes measured; its kernel tables,
// source and uncertainty stay, and provenance.links says where the new tables come from.
int links_only(const ProfileOptions& options, const GpuInventory& inventory, const GpuSpec& gpu, std::ostream& out) {
  sim::ProfileFile base = sim::links_base(gpu, options.profile);
  // What the base said of its link tables: those of the group sizes not measured here stay.
  const nlohmann::json& provenance = base.json["provenance"];
  const std::string earlier =
      provenance.contains("links") && provenance["links"].is_string()
          ? "; the other group sizes' tables as before: " + provenance["links"].get<std::string>()
          : "";
  const CommTimings links = measure_links(inventory, options.quick);
  nlohmann::json profile = sim::with_measured_links(std::move(base.json), links, inventory.devices.at(0).name);
  profile["provenance"]["links"] = std::string("megaplan profile --links-only") + (options.quick ? " --quick" : "") +
                                   " on " + std::to_string(inventory.devices.size()) + " x " +
                                   inventory.devices.at(0).name + " (NCCL " + inventory.nccl.text() + "), " +
                                   sim::utc_date() + ", added to " + base.origin + earlier;
  sim::check_written_profile(profile, "megaplan profile --links-only made a profile");
  write_profile(options, profile, out);
  return 0;
}

int run_profile(const ProfileOptions& options, std::ostream& out) {
  if (options.leave_one_out) return leave_one_out(options, out);
  if (options.links_only && (options.transfer_to || !options.nccl_tests.empty())) {
    throw SpecError("--links-only",
                    "measures links here; it cannot be combined with --transfer-to or --import-nccl-tests");
  }
  if (options.transfer_to) {
    if (!options.nccl_tests.empty()) throw SpecError("--transfer-to", "cannot be combined with --import-nccl-tests");
    write_profile(options, sim::transferred_profile(*options.transfer_to, options.profile), out);
    return 0;
  }
  if (!options.nccl_tests.empty()) {
    write_profile(options, sim::profile_with_nccl_tests(options.nccl_tests, options.profile), out);
    return 0;
  }
  if (options.profile && !options.links_only) {
    throw SpecError("--profile",
                    "is the base of --links-only, --import-nccl-tests or --transfer-to; a measurement "
                    "here starts from the datasheet");
  }
  const GpuInventory inventory = query_gpu_inventory();  // SpecError("gpu", ...) without a usable GPU
  const GpuDevice& device = inventory.devices.at(0);
  const std::optional<GpuSpec> gpu = gpu_preset_for_device(device.name);
  if (!gpu) {
    throw SpecError("gpu", "device 0 is " + device.name +
                               ", which no preset GPU describes (H100 SXM5 80GB, H200 SXM, A100 SXM4 80GB): its "
                               "datasheet rates are needed beside the measured tables");
  }
  const auto gpus = static_cast<int64_t>(inventory.devices.size());
  if (options.links_only) {
    if (gpus < 2) throw SpecError("--links-only", "times NCCL between GPUs: it needs two or more visible, found 1");
    return links_only(options, inventory, *gpu, out);
  }
  const std::string command = std::string("megaplan profile") + (options.quick ? " --quick" : "");
  const std::string date = sim::utc_date();
  MeasuredTables tables;
  {
    const std::unique_ptr<exec::Backend> backend = exec::make_cuda_backend();
    ProgressBar bar(options.quick ? "profiling (quick)" : "profiling");
    tables = exec::measure_kernels(*backend, exec::profile_grid(options.quick),
                                   [&bar](int64_t done, int64_t total) { bar.update(done, total); });
  }
  std::optional<CommTimings> links;
  if (gpus >= 2) links = measure_links(inventory, options.quick);
  const nlohmann::json provenance = measurement_provenance(inventory, tables.mark_seconds, date, command);
  const std::string source = "measured: " + command + " on " + device.name + ", " + date;
  nlohmann::json profile = sim::measured_profile_json(*gpu, tables, source, provenance);
  if (links) {
    profile = sim::with_measured_links(std::move(profile), *links, device.name);
    sim::check_written_profile(profile, "megaplan profile measured link tables");
  }
  write_profile(options, profile, out);
  return 0;
}

}  // namespace

void setup_profile_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<ProfileOptions>();
  CLI::App* command =
      app.add_subcommand("profile",
                         "Time the executor's GEMMs, attention and memory-bound kernels on GPU 0 (and NCCL's "
                         "collectives where two GPUs or more are visible) into a measured profile");
  command->add_option("--out", options->out, "Write the profile here (atomically); default: stdout");
  command->add_flag("--quick", options->quick, "A smaller grid: under a minute on an H100 (full: about five)");
  command->add_flag("--links-only", options->links_only,
                    "Time only NCCL's collectives, send/receive and compute beside them over the visible GPUs (two or "
                    "more) and add them to --profile FILE, else the GPU's built-in measured profile");
  command->add_option(
      "--import-nccl-tests", options->nccl_tests,
      "Time nothing: add these nccl-tests outputs (all_reduce_perf, all_gather_perf, reduce_scatter_perf, "
      "alltoall_perf, sendrecv_perf) to their GPU's profile as its collectives and p2p tables");
  command->add_option(
      "--transfer-to", options->transfer_to,
      "Time nothing: carry a measured profile's tables over to this preset GPU (A100-SXM4-80GB, ...) by the "
      "ratio of peaks and bandwidths, with wave quantisation by SM count");
  command->add_option(
      "--profile", options->profile,
      "With --links-only or --import-nccl-tests: the profile to add them to (default: the GPU's built-in measured "
      "profile, "
      "else its datasheet); with --transfer-to: the measured profile to transfer (default: the built-in one "
      "simulate would)");
  command->add_flag("--leave-one-out", options->leave_one_out,
                    "Time nothing: predict each measured GEMM and attention point of --profile FILE from the rest of "
                    "its table and print the errors per table (where the grid is too sparse to interpolate)");
  command->callback([options, &context] { context.exit_code = run_profile(*options, context.out); });
}

}  // namespace megaplan::cli
