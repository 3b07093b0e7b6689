// The profile file's writers; simulator/profile.cc reads what they write.
#include "simulator/profile_writer.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <map>
#include <stdexcept>
#include <utility>

#include "core/device_gpu.h"
#include "core/error.h"
#include "core/json_io.h"
#include "core/text_file.h"
#include "simulator/builtin_profiles.h"
#include "simulator/nccl_tests.h"
#include "simulator/profile.h"
#include "simulator/profile_transfer.h"

namespace megaplan::sim {

std::string utc_date() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm parts{};
  gmtime_r(&now, &parts);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &parts);
  return text;
}

void check_written_profile(const nlohmann::json& profile, const std::string& what) {
  try {
    (void)Profile::from_json(profile, "megaplan profile");
  } catch (const SpecError& error) {
    throw std::logic_error(what + " the simulator refuses: " + error.what());
  }
}

nlohmann::json measured_profile_json(const GpuSpec& gpu, const MeasuredTables& tables, const std::string& source,
                                     const nlohmann::json& provenance) {
  const Profile datasheet = Profile::datasheet(gpu);
  const DeviceRates& rates = datasheet.device();
  const RooflineCurve& curve = datasheet.roofline_curve();
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
  check_written_profile(profile, "megaplan profile wrote a profile");
  return profile;
}

nlohmann::json with_measured_links(nlohmann::json profile, const CommTimings& timings, const std::string& device) {
  const std::string link = to_string(LinkKind::kNvlink);
  std::map<std::pair<CollectiveOp, int64_t>, NcclTestsRun> runs;
  const auto run_of = [&](CollectiveOp op, int64_t group_size) -> NcclTestsRun& {
    NcclTestsRun& run = runs[{op, group_size}];
    run.file = "megaplan profile";
    run.device = device;
    run.op = op;
    run.group_size = group_size;
    run.link = link;
    return run;
  };
  for (const CommTiming& timing : timings.collectives) {
    const double bus_bandwidth =
        static_cast<double>(timing.bytes) * bus_bandwidth_factor(timing.op, timing.group_size) / timing.seconds;
    run_of(timing.op, timing.group_size).bus_bandwidth.emplace_back(timing.bytes, bus_bandwidth);
  }
  for (const CommTiming& timing : timings.p2p) {
    run_of(timing.op, timing.group_size).seconds.emplace_back(timing.bytes, timing.seconds);
  }
  std::vector<NcclTestsRun> tables;
  for (auto& [key, run] : runs) tables.push_back(std::move(run));
  profile = with_link_tables(std::move(profile), tables);
  nlohmann::json overlap = nlohmann::json::array();
  for (const OverlapTiming& timing : timings.overlap) {
    overlap.push_back(
        {{"op", to_string(timing.op)},
         {"group_size", timing.group_size},
         {"link", link},
         {"compute_slowdown", std::max(0.0, timing.compute_beside_s / timing.compute_alone_s - 1)},
         {"collective_slowdown", std::max(0.0, timing.collective_beside_s / timing.collective_alone_s - 1)}});
  }
  // Entries of other group sizes (a smaller machine's) stay, as the link tables' do.
  if (!overlap.empty()) replace_link_entries(profile, "overlap", overlap);
  return profile;
}

nlohmann::json profile_with_nccl_tests(const std::vector<std::string>& files,
                                       const std::optional<std::string>& base_file) {
  std::vector<NcclTestsRun> runs;
  for (const std::string& file : files) runs.push_back(read_nccl_tests(read_text_file(file), file));
  const std::optional<GpuSpec> gpu = gpu_preset_for_device(runs.front().device);
  if (!gpu) {
    throw SpecError("--import-nccl-tests",
                    runs.front().file + ": its GPU, " + runs.front().device +
                        ", is none of the preset GPUs (H100 SXM5 80GB, H200 SXM, A100 SXM4 80GB)");
  }
  for (const NcclTestsRun& run : runs) {
    const std::optional<GpuSpec> other = gpu_preset_for_device(run.device);
    if (!other || other->name != gpu->name) {
      throw SpecError("--import-nccl-tests",
                      run.file + ": measured on " + run.device + ", not on " + gpu->name + " as " + runs.front().file);
    }
  }
  nlohmann::json base;
  if (base_file) {
    base = read_json_file(*base_file);
    (void)Profile::from_json(base, *base_file);  // a malformed base is refused as simulate would
    if (base.value("gpu", "") != gpu->name) {
      throw SpecError("--profile", *base_file + " describes " + base.value("gpu", std::string("?")) +
                                       ", the nccl-tests files " + gpu->name);
    }
  } else if (const auto builtin = builtin_measured_profile_file(gpu->name)) {
    base = builtin->json;
  } else {
    base = measured_profile_json(*gpu, {}, "datasheet rates with imported nccl-tests tables", nlohmann::json::object());
  }
  nlohmann::json profile = with_link_tables(std::move(base), runs);
  std::string listed;
  for (const std::string& file : files) listed += " " + file;
  profile["provenance"]["nccl_tests"] = "megaplan profile --import-nccl-tests" + listed + ", " + utc_date();
  check_written_profile(profile, "profile --import-nccl-tests made a profile");
  return profile;
}

namespace {

GpuSpec preset_gpu(const std::string& name, const std::string& field) {
  std::string known;
  for (const ClusterSpec& preset : cluster_presets()) {
    if (preset.gpu.name == name) return preset.gpu;
    if (known.find(preset.gpu.name) == std::string::npos) known += (known.empty() ? "" : ", ") + preset.gpu.name;
  }
  throw SpecError(field, "\"" + name + "\" is no preset GPU (" + known + ")");
}

}  // namespace

nlohmann::json transferred_profile(const std::string& gpu, const std::optional<std::string>& measured_file) {
  const GpuSpec to = preset_gpu(gpu, "--transfer-to");
  nlohmann::json profile;
  if (measured_file) {
    const nlohmann::json measured = read_json_file(*measured_file);
    const GpuSpec from = preset_gpu(Profile::from_json(measured, *measured_file).gpu_name(), "--profile");
    if (from.name == to.name) throw SpecError("--transfer-to", *measured_file + " already profiles " + to.name);
    profile = transfer_profile(measured, *measured_file, from, to);
  } else {
    if (has_builtin_measured_profile(to.name)) {
      throw SpecError("--transfer-to",
                      to.name + " has a measured profile of its own; pass --profile FILE to transfer another");
    }
    const std::optional<GpuSpec> from = builtin_transfer_source(to);
    if (!from) throw SpecError("--transfer-to", "no built-in measured profile to transfer; pass --profile FILE");
    const std::optional<BuiltinProfileFile> file = builtin_measured_profile_file(from->name);
    profile = transfer_profile(file->json, file->origin, *from, to);
  }
  return profile;
}

ProfileFile links_base(const GpuSpec& gpu, const std::optional<std::string>& base_file) {
  ProfileFile base;
  if (base_file) {
    base.json = read_json_file(*base_file);
    (void)Profile::from_json(base.json, *base_file);  // a malformed base is refused as simulate would
    base.origin = *base_file;
  } else if (const auto builtin = builtin_measured_profile_file(gpu.name)) {
    base = {builtin->json, builtin->origin};
  } else {
    throw SpecError("--links-only",
                    gpu.name + " has no built-in measured profile to add links to; pass --profile FILE");
  }
  if (base.json.value("gpu", "") != gpu.name) {
    throw SpecError("--profile",
                    base.origin + " describes " + base.json.value("gpu", std::string("?")) + ", GPU 0 is " + gpu.name);
  }
  return base;
}

}  // namespace megaplan::sim
