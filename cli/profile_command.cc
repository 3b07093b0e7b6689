// `megaplan profile`: flag mapping, the GPU's identity and the file.
#include "cli/profile_command.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <map>
#include <memory>
#include <stdexcept>
#include <utility>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/progress_bar.h"
#include "core/device_gpu.h"
#include "core/error.h"
#include "core/json_io.h"
#include "core/text_file.h"
#include "core/version.h"
#include "executor/gpu_inventory.h"
#include "executor/io/staged_file.h"
#include "executor/runtime/cuda_backend.h"
#include "simulator/builtin_profiles.h"
#include "simulator/nccl_tests.h"
#include "simulator/profile.h"
#include "simulator/profile_transfer.h"

namespace megaplan::cli {
namespace {

std::string utc_date() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm parts{};
  gmtime_r(&now, &parts);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &parts);
  return text;
}

// A profile this command wrote must load as the simulator loads it; a refusal is a bug here.
void check_written(const nlohmann::json& profile, const std::string& what) {
  try {
    (void)sim::Profile::from_json(profile, "megaplan profile");
  } catch (const SpecError& error) {
    throw std::logic_error(what + " the simulator refuses: " + error.what());
  }
}

}  // namespace

nlohmann::json measured_profile_json(const GpuSpec& gpu, const exec::MeasuredTables& tables, const std::string& source,
                                     const nlohmann::json& provenance) {
  const sim::Profile datasheet = sim::Profile::datasheet(gpu);
  const sim::DeviceRates& rates = datasheet.device();
  const sim::RooflineCurve& curve = datasheet.roofline_curve();
  nlohmann::json profile = {{"schema", "megaplan-profile/1"},
                            {"gpu", gpu.name},
                            {"source", source},
                            {"provenance", provenance},
                            {"device",
                             {{"peak_bf16_flops_per_s", rates.peak_bf16_flops_per_s},
                              {"peak_fp32_flops_per_s", rates.peak_fp32_flops_per_s},
                              {"memory_bandwidth_bytes_per_s", rates.memory_bandwidth_bytes_per_s},
                              {"kernel_launch_s", rates.kernel_launch_s}}},
                            {"roofline",
                             {{"gemm_max_efficiency", curve.gemm_max_efficiency},
                              {"gemm_half_efficiency_flops", curve.gemm_half_efficiency_flops},
                              {"attention_max_efficiency", curve.attention_max_efficiency},
                              {"attention_half_efficiency_flops", curve.attention_half_efficiency_flops},
                              {"memory_efficiency", curve.memory_efficiency},
                              {"link_efficiency", curve.link_efficiency}}},
                            {"gemm", tables.gemm},
                            {"attention", tables.attention},
                            {"kernels", tables.kernels}};
  check_written(profile, "megaplan profile wrote a profile");
  return profile;
}

nlohmann::json with_measured_links(nlohmann::json profile, const exec::CommTimings& timings,
                                   const std::string& device) {
  const std::string link = sim::to_string(sim::LinkKind::kNvlink);
  std::map<std::pair<CollectiveOp, int64_t>, sim::NcclTestsRun> runs;
  const auto run_of = [&](CollectiveOp op, int64_t group_size) -> sim::NcclTestsRun& {
    sim::NcclTestsRun& run = runs[{op, group_size}];
    run.file = "megaplan profile";
    run.device = device;
    run.op = op;
    run.group_size = group_size;
    run.link = link;
    return run;
  };
  for (const exec::CommTiming& timing : timings.collectives) {
    const double bus_bandwidth =
        static_cast<double>(timing.bytes) * sim::bus_bandwidth_factor(timing.op, timing.group_size) / timing.seconds;
    run_of(timing.op, timing.group_size).bus_bandwidth.emplace_back(timing.bytes, bus_bandwidth);
  }
  for (const exec::CommTiming& timing : timings.p2p) {
    run_of(timing.op, timing.group_size).seconds.emplace_back(timing.bytes, timing.seconds);
  }
  std::vector<sim::NcclTestsRun> tables;
  for (auto& [key, run] : runs) tables.push_back(std::move(run));
  profile = sim::with_link_tables(std::move(profile), tables);
  nlohmann::json overlap = nlohmann::json::array();
  for (const exec::OverlapTiming& timing : timings.overlap) {
    overlap.push_back(
        {{"op", to_string(timing.op)},
         {"group_size", timing.group_size},
         {"link", link},
         {"compute_slowdown", std::max(0.0, timing.compute_beside_s / timing.compute_alone_s - 1)},
         {"collective_slowdown", std::max(0.0, timing.collective_beside_s / timing.collective_alone_s - 1)}});
  }
  // Entries of other group sizes (a smaller machine's) stay, as the link tables' do.
  if (!overlap.empty()) sim::replace_link_entries(profile, "overlap", overlap);
  return profile;
}

namespace {

void write_profile(const ProfileOptions& options, const nlohmann::json& profile, std::ostream& out) {
  const std::string text = profile.dump(1) + "\n";
  if (options.out) {
    exec::write_file_atomically(*options.out, text);
  } else {
    out << text;
  }
}

int import_nccl_tests(const ProfileOptions& options, std::ostream& out) {
  std::vector<sim::NcclTestsRun> runs;
  for (const std::string& file : options.nccl_tests) runs.push_back(sim::read_nccl_tests(read_text_file(file), file));
  const std::optional<GpuSpec> gpu = gpu_preset_for_device(runs.front().device);
  if (!gpu) {
    throw SpecError("--import-nccl-tests",
                    runs.front().file + ": its GPU, " + runs.front().device +
                        ", is none of the preset GPUs (H100 SXM5 80GB, H200 SXM, A100 SXM4 80GB)");
  }
  for (const sim::NcclTestsRun& run : runs) {
    const std::optional<GpuSpec> other = gpu_preset_for_device(run.device);
    if (!other || other->name != gpu->name) {
      throw SpecError("--import-nccl-tests",
                      run.file + ": measured on " + run.device + ", not on " + gpu->name + " as " + runs.front().file);
    }
  }
  nlohmann::json base;
  if (options.profile) {
    base = read_json_file(*options.profile);
    (void)sim::Profile::from_json(base, *options.profile);  // a malformed base is refused as simulate would
    if (base.value("gpu", "") != gpu->name) {
      throw SpecError("--profile", *options.profile + " describes " + base.value("gpu", std::string("?")) +
                                       ", the nccl-tests files " + gpu->name);
    }
  } else if (const auto builtin = sim::builtin_measured_profile_file(gpu->name)) {
    base = builtin->json;
  } else {
    base = measured_profile_json(*gpu, {}, "datasheet rates with imported nccl-tests tables", nlohmann::json::object());
  }
  nlohmann::json profile = sim::with_link_tables(std::move(base), runs);
  std::string files;
  for (const std::string& file : options.nccl_tests) files += " " + file;
  profile["provenance"]["nccl_tests"] = "megaplan profile --import-nccl-tests" + files + ", " + utc_date();
  check_written(profile, "profile --import-nccl-tests made a profile");
  write_profile(options, profile, out);
  return 0;
}

GpuSpec preset_gpu(const std::string& name, const std::string& field) {
  std::string known;
  for (const ClusterSpec& preset : cluster_presets()) {
    if (preset.gpu.name == name) return preset.gpu;
    if (known.find(preset.gpu.name) == std::string::npos) known += (known.empty() ? "" : ", ") + preset.gpu.name;
  }
  throw SpecError(field, "\"" + name + "\" is no preset GPU (" + known + ")");
}

int transfer(const ProfileOptions& options, std::ostream& out) {
  const GpuSpec to = preset_gpu(*options.transfer_to, "--transfer-to");
  nlohmann::json profile;
  if (options.profile) {
    const nlohmann::json measured = read_json_file(*options.profile);
    const GpuSpec from = preset_gpu(sim::Profile::from_json(measured, *options.profile).gpu_name(), "--profile");
    if (from.name == to.name) throw SpecError("--transfer-to", *options.profile + " already profiles " + to.name);
    profile = sim::transfer_profile(measured, *options.profile, from, to);
  } else {
    if (sim::builtin_measured_profile_file(to.name)) {
      throw SpecError("--transfer-to",
                      to.name + " has a measured profile of its own; pass --profile FILE to transfer another");
    }
    const std::optional<sim::Profile> builtin = sim::builtin_transferred_profile(to);
    if (!builtin) throw SpecError("--transfer-to", "no built-in measured profile to transfer; pass --profile FILE");
    const GpuSpec from = preset_gpu(builtin->transferred_from(), "--transfer-to");
    const std::optional<sim::BuiltinProfileFile> file = sim::builtin_measured_profile_file(from.name);
    profile = sim::transfer_profile(file->json, file->origin, from, to);
  }
  write_profile(options, profile, out);
  return 0;
}

// NCCL over every visible GPU (all of one type, one host: NVLink on the SXM boards).
exec::CommTimings measure_links(const GpuInventory& inventory, bool quick) {
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
  nlohmann::json base;
  std::string origin;
  if (options.profile) {
    base = read_json_file(*options.profile);
    (void)sim::Profile::from_json(base, *options.profile);  // a malformed base is refused as simulate would
    origin = *options.profile;
  } else if (const auto builtin = sim::builtin_measured_profile_file(gpu.name)) {
    base = builtin->json;
    origin = builtin->origin;
  } else {
    throw SpecError("--links-only",
                    gpu.name + " has no built-in measured profile to add links to; pass --profile FILE");
  }
  if (base.value("gpu", "") != gpu.name) {
    throw SpecError("--profile",
                    origin + " describes " + base.value("gpu", std::string("?")) + ", GPU 0 is " + gpu.name);
  }
  const exec::CommTimings links = measure_links(inventory, options.quick);
  nlohmann::json profile = with_measured_links(std::move(base), links, inventory.devices.at(0).name);
  profile["provenance"]["links"] = std::string("megaplan profile --links-only") + (options.quick ? " --quick" : "") +
                                   " on " + std::to_string(inventory.devices.size()) + " x " +
                                   inventory.devices.at(0).name + " (NCCL " + inventory.nccl.text() + "), " +
                                   utc_date() + ", added to " + origin;
  check_written(profile, "megaplan profile --links-only made a profile");
  write_profile(options, profile, out);
  return 0;
}

}  // namespace

int run_profile(const ProfileOptions& options, std::ostream& out) {
  if (options.links_only && (options.transfer_to || !options.nccl_tests.empty())) {
    throw SpecError("--links-only",
                    "measures links here; it cannot be combined with --transfer-to or --import-nccl-tests");
  }
  if (options.transfer_to) {
    if (!options.nccl_tests.empty()) throw SpecError("--transfer-to", "cannot be combined with --import-nccl-tests");
    return transfer(options, out);
  }
  if (!options.nccl_tests.empty()) return import_nccl_tests(options, out);
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
  const std::string date = utc_date();
  exec::MeasuredTables tables;
  {
    const std::unique_ptr<exec::Backend> backend = exec::make_cuda_backend();
    ProgressBar bar(options.quick ? "profiling (quick)" : "profiling");
    tables = exec::measure_kernels(*backend, exec::profile_grid(options.quick),
                                   [&bar](int64_t done, int64_t total) { bar.update(done, total); });
  }
  std::optional<exec::CommTimings> links;
  if (gpus >= 2) links = measure_links(inventory, options.quick);
  const nlohmann::json provenance = {{"device", device.name},
                                     {"compute_capability", device.sm_architecture()},
                                     {"sm_count", device.sm_count},
                                     {"sm_clock_khz", device.sm_clock_khz},
                                     {"memory_clock_khz", device.memory_clock_khz},
                                     {"memory_bus_width_bits", device.memory_bus_width_bits},
                                     {"cuda_driver", inventory.cuda_driver.text(false)},
                                     {"cuda_runtime", inventory.cuda_runtime.text(false)},
                                     {"cublas", inventory.cublas.text()},
                                     {"cublaslt", inventory.cublaslt.text()},
                                     {"nccl", inventory.nccl.text()},
                                     {"timing_mark_s", tables.mark_seconds},
                                     {"gpus", gpus},
                                     {"megaplan", kVersion},
                                     {"date", date},
                                     {"command", command}};
  const std::string source = "measured: " + command + " on " + device.name + ", " + date;
  nlohmann::json profile = measured_profile_json(*gpu, tables, source, provenance);
  if (links) {
    profile = with_measured_links(std::move(profile), *links, device.name);
    check_written(profile, "megaplan profile measured link tables");
  }
  write_profile(options, profile, out);
  return 0;
}

void setup_profile_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<ProfileOptions>();
  CLI::App* command =
      app.add_subcommand("profile",
                         "Time the executor's GEMMs, attention and memory-bound kernels on GPU 0 (and NCCL's "
                         "collectives where two GPUs or more are visible) into a measured profile");
  command->add_option("--out", options->out, "Write the profile here (atomically); default: stdout");
  command->add_flag("--quick", options->quick, "A smaller grid: under a minute on an H100 (full: under five)");
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
  command->callback([options, &context] { context.exit_code = run_profile(*options, context.out); });
}

}  // namespace megaplan::cli
