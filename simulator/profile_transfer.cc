// Measured tables scaled to another GPU's datasheet (see the header for the rules).
#include "simulator/profile_transfer.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/error.h"
#include "simulator/builtin_profiles.h"

namespace megaplan::sim {

namespace {

constexpr int64_t kTile = 128;  // a GEMM's output tile edge, and attention's query rows per block

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The fraction of a GPU's SM-waves that work fills: tiles / (S * ceil(tiles / S)); 1 when S is unknown.
double wave_fill(int64_t tiles, int64_t sms) {
  if (sms <= 0 || tiles <= 0) return 1;
  return static_cast<double>(tiles) / static_cast<double>(sms * ceil_div(tiles, sms));
}

struct Scaling {
  double launch_s;  // the measured launch gap: latency that no rate changes
  double compute;   // from's peak / to's peak
  double memory;    // from's bandwidth / to's bandwidth
  int64_t from_sms;
  int64_t to_sms;

  double time(double seconds, double factor) const {
    return std::min(seconds, launch_s) + std::max(0.0, seconds - launch_s) * factor;
  }
  double compute_time(double seconds, int64_t tiles) const {
    return time(seconds, compute * wave_fill(tiles, from_sms) / wave_fill(tiles, to_sms));
  }
};

// Output tiles of a linear layer's product in its layout (core/kernel_list.h: m, n, k are the
// forward shape): y[m x n], dx[m x k], dW[n x k].
int64_t gemm_tiles(const nlohmann::json& entry) {
  const int64_t m = entry.at("m").get<int64_t>();
  const int64_t n = entry.at("n").get<int64_t>();
  const int64_t k = entry.at("k").get<int64_t>();
  const std::string layout = entry.value("layout", std::string("forward"));
  const auto [rows, cols] = layout == "input_gradient"    ? std::pair{m, k}
                            : layout == "weight_gradient" ? std::pair{n, k}
                                                          : std::pair{m, n};
  return ceil_div(rows, kTile) * ceil_div(cols, kTile);
}

std::string number(double value) {
  std::ostringstream out;
  out.precision(4);
  out << value;
  return out.str();
}

}  // namespace

nlohmann::json transfer_profile(const nlohmann::json& measured, const std::string& origin, const GpuSpec& from,
                                const GpuSpec& to) {
  const Profile source = Profile::from_json(measured, origin);  // refuses a malformed file with its field
  if (source.gpu_name() != from.name) {
    throw SpecError(origin, "profiles " + source.gpu_name() + ", not " + from.name);
  }
  if (source.kind() != ProfileKind::kMeasured) {
    throw SpecError(origin, "holds no measured table to transfer (its kind is " + to_string(source.kind()) + ")");
  }
  const Scaling scaling{source.device().kernel_launch_s, from.dense_bf16_flops_per_s / to.dense_bf16_flops_per_s,
                        from.hbm_bandwidth_bytes_per_s / to.hbm_bandwidth_bytes_per_s, from.streaming_multiprocessors,
                        to.streaming_multiprocessors};
  const bool same_die = from.streaming_multiprocessors == to.streaming_multiprocessors &&
                        from.dense_bf16_flops_per_s == to.dense_bf16_flops_per_s;

  nlohmann::json profile = measured;
  profile["gpu"] = to.name;
  profile["device"]["peak_bf16_flops_per_s"] = to.dense_bf16_flops_per_s;
  profile["device"]["peak_fp32_flops_per_s"] =
      source.device().peak_fp32_flops_per_s * to.dense_bf16_flops_per_s / from.dense_bf16_flops_per_s;
  profile["device"]["memory_bandwidth_bytes_per_s"] = to.hbm_bandwidth_bytes_per_s;
  profile["uncertainty"] =
      std::max(source.uncertainty(), same_die ? kSameDieTransferUncertainty : kDatasheetUncertainty);
  for (nlohmann::json& entry : profile["gemm"]) {
    entry["seconds"] = scaling.compute_time(entry.at("seconds").get<double>(), gemm_tiles(entry));
    entry.erase("spread");
  }
  if (profile.contains("attention") && profile["attention"].is_array()) {
    for (nlohmann::json& entry : profile["attention"]) {
      const int64_t blocks = entry.at("batch_heads").get<int64_t>() * ceil_div(entry.at("seq").get<int64_t>(), kTile);
      for (const char* key : {"forward_s", "backward_s"})
        entry[key] = scaling.compute_time(entry.at(key).get<double>(), blocks);
      entry.erase("spread");
    }
  }
  for (const char* table : {"kernels", "elementwise"}) {
    if (!profile.contains(table) || !profile[table].is_array()) continue;
    for (nlohmann::json& entry : profile[table]) {
      entry["seconds"] = scaling.time(entry.at("seconds").get<double>(), scaling.memory);
      entry.erase("spread");
    }
  }
  profile.erase("collectives");
  profile.erase("p2p");
  profile.erase("overlap");
  profile["transferred_from"] = {
      {"gpu", from.name},
      {"origin", origin},
      {"compute_scale", scaling.compute},
      {"memory_scale", scaling.memory},
      {"streaming_multiprocessors", {from.streaming_multiprocessors, to.streaming_multiprocessors}}};
  profile["source"] = "transferred from " + from.name + " (" + origin + "): GEMM and attention x " +
                      number(scaling.compute) + " with wave quantisation for " +
                      std::to_string(to.streaming_multiprocessors) + " SMs, memory-bound x " + number(scaling.memory) +
                      ", links from the link model; " +
                      (same_die ? "validated between H100 and H200" : "not validated across architectures");
  return profile;
}

std::optional<GpuSpec> builtin_transfer_source(const GpuSpec& to) {
  if (has_builtin_measured_profile(to.name)) return std::nullopt;
  std::optional<GpuSpec> best;
  const auto distance = [&](const GpuSpec& gpu) {
    const bool same_die = gpu.streaming_multiprocessors == to.streaming_multiprocessors &&
                          gpu.dense_bf16_flops_per_s == to.dense_bf16_flops_per_s;
    return (same_die ? 0.0 : 1.0) + std::abs(std::log(gpu.dense_bf16_flops_per_s / to.dense_bf16_flops_per_s));
  };
  for (const ClusterSpec& preset : cluster_presets()) {
    const GpuSpec& gpu = preset.gpu;
    if (!has_builtin_measured_profile(gpu.name)) continue;
    if (!best || distance(gpu) < distance(*best)) best = gpu;
  }
  return best;
}

std::optional<Profile> builtin_transferred_profile(const GpuSpec& to) {
  const std::optional<GpuSpec> from = builtin_transfer_source(to);
  if (!from) return std::nullopt;
  const std::optional<BuiltinProfileFile> file = builtin_measured_profile_file(from->name);
  return Profile::from_json(transfer_profile(file->json, file->origin, *from, to), file->origin);
}

}  // namespace megaplan::sim
