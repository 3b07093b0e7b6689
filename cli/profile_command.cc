// `megaplan profile`: flag mapping, the GPU's identity and the file.
#include "cli/profile_command.h"

#include <chrono>
#include <ctime>
#include <memory>
#include <stdexcept>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/progress_bar.h"
#include "core/device_gpu.h"
#include "core/error.h"
#include "core/version.h"
#include "executor/gpu_inventory.h"
#include "executor/io/staged_file.h"
#include "executor/runtime/cuda_backend.h"
#include "simulator/profile.h"

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

}  // namespace

nlohmann::json measured_profile_json(const GpuSpec& gpu, const exec::MeasuredTables& tables, const std::string& source,
                                     const nlohmann::json& provenance) {
  const sim::Profile datasheet = sim::Profile::datasheet(gpu);
  const sim::DeviceRates& rates = datasheet.device();
  const sim::RooflineCurve& curve = datasheet.roofline_curve();
  nlohmann::json profile = {
      {"schema", "megaplan-profile/1"},
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
  try {
    (void)sim::Profile::from_json(profile, "megaplan profile");
  } catch (const SpecError& error) {
    throw std::logic_error(std::string("megaplan profile wrote a profile the simulator refuses: ") + error.what());
  }
  return profile;
}

int run_profile(const ProfileOptions& options, std::ostream& out) {
  const GpuInventory inventory = query_gpu_inventory();  // SpecError("gpu", ...) without a usable GPU
  const GpuDevice& device = inventory.devices.at(0);
  const std::optional<GpuSpec> gpu = gpu_preset_for_device(device.name);
  if (!gpu) {
    throw SpecError("gpu", "device 0 is " + device.name +
                               ", which no preset GPU describes (H100 SXM5 80GB, H200 SXM, A100 SXM4 80GB): its "
                               "datasheet rates are needed beside the measured tables");
  }
  const std::unique_ptr<exec::Backend> backend = exec::make_cuda_backend();
  const std::string command = std::string("megaplan profile") + (options.quick ? " --quick" : "");
  const std::string date = utc_date();
  exec::MeasuredTables tables;
  {
    ProgressBar bar(options.quick ? "profiling (quick)" : "profiling");
    tables = exec::measure_kernels(*backend, exec::profile_grid(options.quick),
                                   [&bar](int64_t done, int64_t total) { bar.update(done, total); });
  }
  const nlohmann::json provenance = {{"device", device.name},
                                     {"compute_capability", device.sm_architecture()},
                                     {"sm_count", device.sm_count},
                                     {"memory_clock_khz", device.memory_clock_khz},
                                     {"memory_bus_width_bits", device.memory_bus_width_bits},
                                     {"cuda_driver", inventory.cuda_driver.text(false)},
                                     {"cuda_runtime", inventory.cuda_runtime.text(false)},
                                     {"cublas", inventory.cublas.text()},
                                     {"cublaslt", inventory.cublaslt.text()},
                                     {"nccl", inventory.nccl.text()},
                                     {"megaplan", kVersion},
                                     {"date", date},
                                     {"command", command}};
  const std::string source = "measured: " + command + " on " + device.name + ", " + date;
  const std::string text = measured_profile_json(*gpu, tables, source, provenance).dump(1) + "\n";
  if (options.out) {
    exec::write_file_atomically(*options.out, text);
  } else {
    out << text;
  }
  return 0;
}

void setup_profile_command(CLI::App& app, CommandContext& context) {
  auto options = std::make_shared<ProfileOptions>();
  CLI::App* command = app.add_subcommand(
      "profile", "Time the executor's GEMMs, attention and memory-bound kernels on GPU 0 into a measured profile");
  command->add_option("--out", options->out, "Write the profile here (atomically); default: stdout");
  command->add_flag("--quick", options->quick, "A smaller grid: under a minute on an H100 (full: under five)");
  command->callback([options, &context] { context.exit_code = run_profile(*options, context.out); });
}

}  // namespace megaplan::cli
