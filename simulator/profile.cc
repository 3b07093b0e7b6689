// Profile tables, their interpolation, and the roofline fallback.
#include "simulator/profile.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/json_io.h"

namespace megaplan::sim {

namespace {

constexpr const char* kSchema = "megaplan-profile/1";
constexpr std::size_t kNeighbours = 4;  // table points blended per GEMM/attention estimate
// Dense TF32 is half of dense bf16 on the A100 (156/312), H100 SXM and H200 (494.7/989.4)
// datasheets; core's GpuSpec carries no TF32 rate, and a profile may omit it.
constexpr double kTf32PerBf16Peak = 0.5;
double log_of(int64_t value) { return std::log(static_cast<double>(value)); }

int64_t ring_steps(CollectiveOp op, int64_t n) { return op == CollectiveOp::kAllReduce ? 2 * (n - 1) : n - 1; }

// --- JSON reading -------------------------------------------------------------------------

const nlohmann::json& array_field(const nlohmann::json& json, const std::string& key, const std::string& source) {
  static const nlohmann::json empty = nlohmann::json::array();
  if (!json.contains(key) || json.at(key).is_null()) return empty;
  if (!json.at(key).is_array()) throw SpecError(source + ": " + key, "must be a JSON array");
  return json.at(key);
}

double positive(JsonFieldReader& reader, const std::string& key) {
  double value = 0;
  reader.require(key, value);
  if (!(value > 0) || !std::isfinite(value)) {
    throw SpecError(reader.field(key), "must be a positive number, got " + nlohmann::json(value).dump());
  }
  return value;
}

int64_t positive_integer(JsonFieldReader& reader, const std::string& key) {
  int64_t value = 0;
  reader.require(key, value);
  if (value <= 0) throw SpecError(reader.field(key), "must be a positive integer, got " + std::to_string(value));
  return value;
}

// A measured entry's optional spread: (p90 - p10) / median of its repetitions, >= 0. Lookups do
// not use it; it says how far a measured time can be trusted.
void optional_spread(JsonFieldReader& reader) {
  double value = 0;
  if (!reader.read("spread", value)) return;
  if (!(value >= 0) || !std::isfinite(value)) {
    throw SpecError(reader.field("spread"), "must be a number >= 0, got " + nlohmann::json(value).dump());
  }
}

double efficiency(JsonFieldReader& reader, const std::string& key) {
  const double value = positive(reader, key);
  if (value > 1) throw SpecError(reader.field(key), "must be in (0, 1], got " + nlohmann::json(value).dump());
  return value;
}

// A name field that must be one of `names`: its index there.
template <typename Names>
std::size_t parse_listed(JsonFieldReader& reader, const std::string& key, const Names& names) {
  std::string text;
  reader.require(key, text);
  std::string known;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (text == names[i]) return i;
    known += (known.empty() ? "" : ", ") + std::string(names[i]);
  }
  throw SpecError(reader.field(key), "must be one of " + known + "; got \"" + text + "\"");
}

template <typename Enum, std::size_t N>
Enum parse_name(JsonFieldReader& reader, const std::string& key,
                const std::array<std::pair<const char*, Enum>, N>& names) {
  std::array<const char*, N> texts;
  for (std::size_t i = 0; i < N; ++i) texts[i] = names[i].first;
  return names[parse_listed(reader, key, texts)].second;
}

// The same over values that name themselves (core's to_string: one spelling per concept).
template <typename Enum, std::size_t N>
Enum parse_name(JsonFieldReader& reader, const std::string& key, const std::array<Enum, N>& values) {
  std::array<std::string, N> texts;
  for (std::size_t i = 0; i < N; ++i) texts[i] = to_string(values[i]);
  return values[parse_listed(reader, key, texts)];
}

constexpr std::array<std::pair<const char*, LinkKind>, 2> kLinks = {
    {{"nvlink", LinkKind::kNvlink}, {"network", LinkKind::kNetwork}}};

template <typename Enum, std::size_t N>
std::string name_of(Enum value, const std::array<std::pair<const char*, Enum>, N>& names) {
  for (const auto& [name, candidate] : names) {
    if (candidate == value) return name;
  }
  return "?";
}

std::string entry_source(const std::string& source, const std::string& table, std::size_t i) {
  return source + ": " + table + "[" + std::to_string(i) + "]";
}

// Two measurements of one point would make the interpolation ambiguous (or divide by zero).
template <typename Key>
void reject_duplicate(std::map<Key, std::size_t>& seen, const Key& key, const std::string& source,
                      const std::string& table, std::size_t i, const std::string& what) {
  const auto [previous, inserted] = seen.emplace(key, i);
  if (!inserted) {
    throw SpecError(entry_source(source, table, i),
                    "same " + what + " as " + table + "[" + std::to_string(previous->second) + "]");
  }
}

}  // namespace

RooflineCurve default_roofline_curve() {
  RooflineCurve curve;
  curve.gemm_max_efficiency = 0.80;        // large bf16 cuBLAS GEMMs
  curve.gemm_half_efficiency_flops = 1e9;  // a 1 GFLOP GEMM reaches half of that
  curve.attention_max_efficiency = 0.50;   // FlashAttention-2-class kernels
  curve.attention_half_efficiency_flops = 1e9;
  curve.memory_efficiency = 0.85;  // streaming kernels against HBM peak
  curve.link_efficiency = 0.80;    // NCCL bus bandwidth against link rate
  return curve;
}

double Profile::Curve::at(double log_bytes) const {
  if (log_bytes <= points.front().first) return points.front().second;
  if (log_bytes >= points.back().first) return points.back().second;
  const auto upper = std::partition_point(points.begin(), points.end(),
                                          [log_bytes](const auto& point) { return point.first < log_bytes; });
  const auto lower = upper - 1;
  const double t = (log_bytes - lower->first) / (upper->first - lower->first);
  return lower->second + t * (upper->second - lower->second);
}

Profile Profile::from_json(const nlohmann::json& json, const std::string& source) {
  JsonFieldReader reader(json, source);
  std::string schema;
  reader.require("schema", schema);
  if (schema != kSchema) {
    throw SpecError(reader.field("schema"), "must be \"" + std::string(kSchema) + "\", got \"" + schema + "\"");
  }
  Profile profile;
  profile.origin_ = source;
  reader.require("gpu", profile.gpu_);
  if (profile.gpu_.empty()) throw SpecError(reader.field("gpu"), "must name the GPU type, got \"\"");
  reader.require("source", profile.source_);

  const nlohmann::json* device = reader.read_object("device");
  if (device == nullptr) throw SpecError(reader.field("device"), "required field is missing");
  JsonFieldReader device_reader(*device, source + ": device");
  DeviceRates& rates = profile.device_;
  rates.peak_bf16_flops_per_s = positive(device_reader, "peak_bf16_flops_per_s");
  rates.peak_fp32_flops_per_s = device_reader.has("peak_fp32_flops_per_s")
                                    ? positive(device_reader, "peak_fp32_flops_per_s")
                                    : kTf32PerBf16Peak * rates.peak_bf16_flops_per_s;
  rates.memory_bandwidth_bytes_per_s = positive(device_reader, "memory_bandwidth_bytes_per_s");
  rates.kernel_launch_s = positive(device_reader, "kernel_launch_s");
  device_reader.reject_unknown_keys();

  const nlohmann::json* roofline = reader.read_object("roofline");
  if (roofline == nullptr) throw SpecError(reader.field("roofline"), "required field is missing");
  JsonFieldReader curve_reader(*roofline, source + ": roofline");
  RooflineCurve& curve = profile.curve_;
  curve.gemm_max_efficiency = efficiency(curve_reader, "gemm_max_efficiency");
  curve.gemm_half_efficiency_flops = positive(curve_reader, "gemm_half_efficiency_flops");
  curve.attention_max_efficiency = efficiency(curve_reader, "attention_max_efficiency");
  curve.attention_half_efficiency_flops = positive(curve_reader, "attention_half_efficiency_flops");
  curve.memory_efficiency = efficiency(curve_reader, "memory_efficiency");
  curve.link_efficiency = efficiency(curve_reader, "link_efficiency");
  curve_reader.reject_unknown_keys();

  if (reader.has("uncertainty")) {
    reader.require("uncertainty", profile.uncertainty_);
    if (!(profile.uncertainty_ >= 0 && profile.uncertainty_ < 1)) {
      throw SpecError(reader.field("uncertainty"),
                      "must be a fraction in [0, 1), got " + nlohmann::json(profile.uncertainty_).dump());
    }
  }
  // Where a measured profile comes from (GPU, clocks, driver, libraries, date): free-form, for people.
  if (reader.has("provenance") && !json.at("provenance").is_object()) {
    throw SpecError(reader.field("provenance"), "must be an object");
  }
  // A transferred profile names the measured GPU its tables come from (profile_transfer.h).
  if (const nlohmann::json* transferred = reader.read_object("transferred_from")) {
    JsonFieldReader transferred_reader(*transferred, source + ": transferred_from");
    transferred_reader.require("gpu", profile.transferred_from_);
    if (profile.transferred_from_.empty()) {
      throw SpecError(transferred_reader.field("gpu"), "must name the measured GPU, got \"\"");
    }
  }
  for (const char* key :
       {"gemm", "attention", "elementwise", "kernels", "collectives", "p2p", "overlap", "provenance"}) {
    reader.ignore(key);
  }
  reader.reject_unknown_keys();

  const nlohmann::json& gemms = array_field(json, "gemm", source);
  std::map<std::tuple<int64_t, int64_t, int64_t, DType, GemmLayout, GemmEpilogue>, std::size_t> gemm_seen;
  for (std::size_t i = 0; i < gemms.size(); ++i) {
    JsonFieldReader entry(gemms[i], entry_source(source, "gemm", i));
    const int64_t m = positive_integer(entry, "m");
    const int64_t n = positive_integer(entry, "n");
    const int64_t k = positive_integer(entry, "k");
    const DType dtype = parse_name(entry, "dtype", kDTypes);
    const GemmLayout layout = entry.has("layout") ? parse_name(entry, "layout", kGemmLayouts) : GemmLayout::kForward;
    const GemmEpilogue epilogue =
        entry.has("epilogue") ? parse_name(entry, "epilogue", kGemmEpilogues) : GemmEpilogue::kNone;
    const double seconds = positive(entry, "seconds");
    optional_spread(entry);
    entry.reject_unknown_keys();
    reject_duplicate(gemm_seen, std::tuple{m, n, k, dtype, layout, epilogue}, source, "gemm", i,
                     "m, n, k, dtype, layout and epilogue");
    const ShapePoint point{{log_of(m), log_of(n), log_of(k)}, std::log(gemm_flops(m, n, k) / seconds), seconds};
    profile.gemm_[{dtype, layout, epilogue}].push_back(point);
    profile.gemm_by_layout_[{dtype, layout}].push_back(point);
  }

  const nlohmann::json& attention = array_field(json, "attention", source);
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool, bool>, std::size_t> attention_seen;
  for (std::size_t i = 0; i < attention.size(); ++i) {
    JsonFieldReader entry(attention[i], entry_source(source, "attention", i));
    const int64_t batch_heads = positive_integer(entry, "batch_heads");
    const int64_t seq = positive_integer(entry, "seq");
    const int64_t head_dim = positive_integer(entry, "head_dim");
    const int64_t gqa_ratio = entry.has("gqa_ratio") ? positive_integer(entry, "gqa_ratio") : 1;
    bool causal = false;
    entry.require("causal", causal);
    bool dropout = false;
    if (entry.has("dropout")) entry.require("dropout", dropout);
    bool ring_block = false;
    if (entry.has("ring_block")) entry.require("ring_block", ring_block);
    const double forward_s = positive(entry, "forward_s");
    const double backward_s = positive(entry, "backward_s");
    optional_spread(entry);
    entry.reject_unknown_keys();
    reject_duplicate(attention_seen, std::tuple{batch_heads, seq, head_dim, gqa_ratio, causal, dropout, ring_block},
                     source, "attention", i, "batch_heads, seq, head_dim, gqa_ratio, causal, dropout and ring_block");
    const double flops = attention_forward_flops(batch_heads, seq, head_dim, causal);
    const std::array<double, 3> shape = {log_of(batch_heads), log_of(seq), log_of(head_dim)};
    auto& forward = ring_block ? profile.ring_block_forward_ : profile.attention_forward_;
    auto& backward = ring_block ? profile.ring_block_backward_ : profile.attention_backward_;
    forward[causal][dropout][gqa_ratio].push_back({shape, std::log(flops / forward_s), forward_s});
    backward[causal][dropout][gqa_ratio].push_back(
        {shape, std::log(kAttentionBackwardFactor * flops / backward_s), backward_s});
  }

  const nlohmann::json& elementwise = array_field(json, "elementwise", source);
  std::map<int64_t, std::size_t> elementwise_seen;
  for (std::size_t i = 0; i < elementwise.size(); ++i) {
    JsonFieldReader entry(elementwise[i], entry_source(source, "elementwise", i));
    const int64_t bytes = positive_integer(entry, "bytes");
    const double seconds = positive(entry, "seconds");
    optional_spread(entry);
    entry.reject_unknown_keys();
    reject_duplicate(elementwise_seen, bytes, source, "elementwise", i, "bytes");
    profile.elementwise_.points.emplace_back(log_of(bytes), std::log(seconds));
  }

  const nlohmann::json& kernels = array_field(json, "kernels", source);
  std::map<std::tuple<std::string, int64_t>, std::size_t> kernels_seen;
  for (std::size_t i = 0; i < kernels.size(); ++i) {
    JsonFieldReader entry(kernels[i], entry_source(source, "kernels", i));
    const std::string& kernel_class = memory_kernel_classes()[parse_listed(entry, "kernel", memory_kernel_classes())];
    const int64_t bytes = positive_integer(entry, "bytes");
    const double seconds = positive(entry, "seconds");
    optional_spread(entry);
    entry.reject_unknown_keys();
    reject_duplicate(kernels_seen, std::tuple{kernel_class, bytes}, source, "kernels", i, "kernel and bytes");
    profile.memory_kernels_[kernel_class].points.emplace_back(log_of(bytes), std::log(seconds));
  }

  const nlohmann::json& collectives = array_field(json, "collectives", source);
  std::map<std::tuple<CollectiveOp, int64_t, LinkKind, int64_t>, std::size_t> collectives_seen;
  for (std::size_t i = 0; i < collectives.size(); ++i) {
    JsonFieldReader entry(collectives[i], entry_source(source, "collectives", i));
    const CollectiveOp op = parse_name(entry, "op", kGroupCollectives);
    const int64_t group_size = positive_integer(entry, "group_size");
    const LinkKind link = parse_name(entry, "link", kLinks);
    const int64_t bytes = positive_integer(entry, "bytes");
    const double bus_bandwidth = positive(entry, "bus_bandwidth_bytes_per_s");
    entry.reject_unknown_keys();
    if (group_size < 2)
      throw SpecError(entry.field("group_size"), "must be at least 2, got " + std::to_string(group_size));
    reject_duplicate(collectives_seen, std::tuple{op, group_size, link, bytes}, source, "collectives", i,
                     "op, group_size, link and bytes");
    profile.collectives_[{op, group_size, link}].points.emplace_back(log_of(bytes), std::log(bus_bandwidth));
  }

  const nlohmann::json& p2p = array_field(json, "p2p", source);
  std::map<std::tuple<LinkKind, int64_t>, std::size_t> p2p_seen;
  for (std::size_t i = 0; i < p2p.size(); ++i) {
    JsonFieldReader entry(p2p[i], entry_source(source, "p2p", i));
    const LinkKind link = parse_name(entry, "link", kLinks);
    const int64_t bytes = positive_integer(entry, "bytes");
    const double seconds = positive(entry, "seconds");
    entry.reject_unknown_keys();
    reject_duplicate(p2p_seen, std::tuple{link, bytes}, source, "p2p", i, "link and bytes");
    profile.p2p_[static_cast<std::size_t>(link)].points.emplace_back(log_of(bytes), std::log(seconds));
  }

  const nlohmann::json& overlap = array_field(json, "overlap", source);
  std::map<std::tuple<CollectiveOp, LinkKind, int64_t>, std::size_t> overlap_seen;
  for (std::size_t i = 0; i < overlap.size(); ++i) {
    JsonFieldReader entry(overlap[i], entry_source(source, "overlap", i));
    const CollectiveOp op = parse_name(entry, "op", kCollectiveOps);
    const int64_t group_size = positive_integer(entry, "group_size");
    const LinkKind link = parse_name(entry, "link", kLinks);
    const auto fraction = [&entry](const char* key, double value) {
      if (!(value >= 0) || !std::isfinite(value)) {
        throw SpecError(entry.field(key), "must be a number >= 0, got " + nlohmann::json(value).dump());
      }
      return value;
    };
    double compute = 0;
    entry.require("compute_slowdown", compute);
    double collective = 0;
    const bool collective_measured = entry.read("collective_slowdown", collective);
    entry.reject_unknown_keys();
    if (group_size < 2)
      throw SpecError(entry.field("group_size"), "must be at least 2, got " + std::to_string(group_size));
    reject_duplicate(overlap_seen, std::tuple{op, link, group_size}, source, "overlap", i, "op, group_size and link");
    profile.compute_slowdown_[{op, link, group_size}] = fraction("compute_slowdown", compute);
    if (collective_measured) {
      profile.collective_slowdown_[{op, link, group_size}] = fraction("collective_slowdown", collective);
    }
  }

  // Curves are searched by bytes; sorted once here so lookups only bisect.
  std::sort(profile.elementwise_.points.begin(), profile.elementwise_.points.end());
  for (auto& [name, kernel_curve] : profile.memory_kernels_)
    std::sort(kernel_curve.points.begin(), kernel_curve.points.end());
  for (auto& [key, bus_curve] : profile.collectives_) std::sort(bus_curve.points.begin(), bus_curve.points.end());
  for (Curve& p2p_curve : profile.p2p_) std::sort(p2p_curve.points.begin(), p2p_curve.points.end());
  return profile;
}

Profile Profile::load(const std::string& path) { return from_json(read_json_file(path), path); }

Profile Profile::datasheet(const GpuSpec& gpu) {
  Profile profile;
  profile.gpu_ = gpu.name;
  profile.source_ = "datasheet";  // short: `megaplan simulate` prints it in parentheses
  profile.origin_ = "datasheet";
  profile.uncertainty_ = kDatasheetUncertainty;
  profile.device_.peak_bf16_flops_per_s = gpu.dense_bf16_flops_per_s;
  profile.device_.peak_fp32_flops_per_s = kTf32PerBf16Peak * gpu.dense_bf16_flops_per_s;
  profile.device_.memory_bandwidth_bytes_per_s = gpu.hbm_bandwidth_bytes_per_s;
  profile.device_.kernel_launch_s = kDatasheetKernelLaunchS;
  profile.curve_ = default_roofline_curve();
  return profile;
}

double Profile::roofline(double flops, double peak, double max_efficiency, double half_flops, double bytes) const {
  const double compute = flops / (peak * max_efficiency * flops / (flops + half_flops));
  const double memory = bytes / (device_.memory_bandwidth_bytes_per_s * curve_.memory_efficiency);
  return std::max(compute, memory) + device_.kernel_launch_s;
}

// Inverse-squared-distance blend of log throughput over the kNeighbours nearest measured shapes
// in log space, never below `floor_s`; an exact shape returns its own measurement. A linear scan:
// profiler tables hold hundreds of shapes, and the nearest list lives on the stack.
double Profile::shape_lookup(const std::vector<ShapePoint>& points, const std::array<double, 3>& log_shape,
                             double flops, double floor_s) const {
  std::array<std::pair<double, double>, kNeighbours> nearest;  // (squared distance, log throughput), ascending
  nearest.fill({std::numeric_limits<double>::infinity(), 0});
  for (const ShapePoint& point : points) {
    double distance = 0;
    for (std::size_t d = 0; d < 3; ++d) {
      distance += (point.log_shape[d] - log_shape[d]) * (point.log_shape[d] - log_shape[d]);
    }
    if (distance == 0) return point.seconds;
    std::size_t slot = kNeighbours;
    while (slot > 0 && distance < nearest[slot - 1].first) {
      if (slot < kNeighbours) nearest[slot] = nearest[slot - 1];
      --slot;
    }
    if (slot < kNeighbours) nearest[slot] = {distance, point.log_throughput};
  }
  double weights = 0;
  double blended = 0;
  for (const auto& [distance, log_throughput] : nearest) {
    if (!std::isfinite(distance)) break;
    weights += 1 / distance;
    blended += log_throughput / distance;
  }
  return std::max(flops / std::exp(blended / weights), floor_s);
}

// Below the smallest measurement its time (latency-bound); above the largest, that entry's
// bandwidth (time grows with bytes).
double Profile::seconds_from_curve(const Curve& curve, double log_bytes) {
  const auto& last = curve.points.back();
  if (log_bytes > last.first) return std::exp(last.second + log_bytes - last.first);
  return std::exp(curve.at(log_bytes));
}

double Profile::gemm_seconds(int64_t m, int64_t n, int64_t k, DType dtype, CostSources& sources) const {
  return gemm_seconds(GemmLayout::kForward, GemmEpilogue::kNone, m, n, k, dtype, sources);
}

double Profile::gemm_seconds(GemmLayout layout, GemmEpilogue epilogue, int64_t m, int64_t n, int64_t k, DType dtype,
                             CostSources& sources) const {
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  if (dtype == DType::kFloat16 && !gemm_by_layout_.contains({DType::kFloat16, GemmLayout::kForward})) {
    // Without an fp16 table, the bf16 one: the tensor cores' fp16 and bf16 rates are equal on
    // every GPU megaplan knows (A100, H100, H200 datasheets).
    dtype = DType::kBFloat16;
  }
  const double flops = gemm_flops(m, n, k);
  const std::array<double, 3> log_shape = {log_of(m), log_of(n), log_of(k)};
  const double element_bytes = dtype == DType::kFloat32 ? 4 : 2;
  // Each operand read once and the output written once: the floor for a tiled GEMM. An
  // interpolated shape far from the measured ones (unfused attention's k = head dim products) is
  // never faster than that: log-space neighbours of a compute-bound table know nothing of it.
  const double bytes = element_bytes * (static_cast<double>(m) * static_cast<double>(k) +
                                        static_cast<double>(k) * static_cast<double>(n) +
                                        static_cast<double>(m) * static_cast<double>(n));
  const double memory_floor = bytes / (device_.memory_bandwidth_bytes_per_s * curve_.memory_efficiency);
  if (const auto found = gemm_.find({dtype, layout, epilogue}); found != gemm_.end()) {
    ++sources.table;
    return shape_lookup(found->second, log_shape, flops, memory_floor);
  }
  if (const auto found = gemm_by_layout_.find({dtype, layout}); found != gemm_by_layout_.end()) {
    ++sources.table;
    return shape_lookup(found->second, log_shape, flops, memory_floor);
  }
  if (const auto found = gemm_by_layout_.find({dtype, GemmLayout::kForward}); found != gemm_by_layout_.end()) {
    // The product as a forward GEMM of its own shape: dx[m x k] = dy[m x n] W[n x k]; dW[n x k] = dy^T[n x m] x[m x k].
    ++sources.table;
    const std::array<double, 3> product =
        layout == GemmLayout::kInputGradient    ? std::array{log_shape[0], log_shape[2], log_shape[1]}
        : layout == GemmLayout::kWeightGradient ? std::array{log_shape[1], log_shape[2], log_shape[0]}
                                                : log_shape;
    return shape_lookup(found->second, product, flops, memory_floor);
  }
  ++sources.fallback;
  const double peak = dtype == DType::kFloat32 ? device_.peak_fp32_flops_per_s : device_.peak_bf16_flops_per_s;
  return roofline(flops, peak, curve_.gemm_max_efficiency, curve_.gemm_half_efficiency_flops, bytes);
}

double Profile::attention_seconds(const AttentionTablesByDropout& by_dropout, bool backward, int64_t batch_heads,
                                  int64_t seq, int64_t head_dim, bool causal, int64_t gqa_ratio, bool dropout,
                                  CostSources& sources) const {
  // Forward: Q and O, and K and V shared by `gqa_ratio` heads each. Backward: Q, O, dO in and dQ
  // out; K, V in and dK, dV out, shared likewise.
  const double per_head = backward ? 4 : 2;
  const double tensors = per_head + per_head / static_cast<double>(std::max<int64_t>(gqa_ratio, 1));
  const double flops =
      (backward ? kAttentionBackwardFactor : 1.0) * attention_forward_flops(batch_heads, seq, head_dim, causal);
  const bool measured_so = !by_dropout[dropout].empty();
  const AttentionTables& tables = by_dropout[measured_so ? dropout : false];
  if (!tables.empty()) {
    ++(measured_so ? sources.table : sources.fallback);
    // The ratio nearest in log2; of two as near, the larger (the first at or above the request).
    const auto above = tables.lower_bound(gqa_ratio);
    auto nearest = above == tables.end() ? std::prev(above) : above;
    // r is nearer the ratio below (b) than the one above (a) in log2 when r / b < a / r.
    if (above != tables.begin() && above != tables.end() &&
        static_cast<double>(gqa_ratio) * static_cast<double>(gqa_ratio) <
            static_cast<double>(std::prev(above)->first) * static_cast<double>(above->first)) {
      nearest = std::prev(above);
    }
    return shape_lookup(nearest->second, {log_of(batch_heads), log_of(seq), log_of(head_dim)}, flops, 0.0);
  }
  ++sources.fallback;
  const double bytes =
      2.0 * tensors * static_cast<double>(batch_heads) * static_cast<double>(seq) * static_cast<double>(head_dim);
  return roofline(flops, device_.peak_bf16_flops_per_s, curve_.attention_max_efficiency,
                  curve_.attention_half_efficiency_flops, bytes);
}

double Profile::attention_forward_seconds(int64_t batch_heads, int64_t seq, int64_t head_dim, bool causal,
                                          int64_t gqa_ratio, bool dropout, CostSources& sources) const {
  if (batch_heads <= 0 || seq <= 0 || head_dim <= 0) return 0;
  return attention_seconds(attention_forward_[causal], false, batch_heads, seq, head_dim, causal, gqa_ratio, dropout,
                           sources);
}

double Profile::attention_backward_seconds(int64_t batch_heads, int64_t seq, int64_t head_dim, bool causal,
                                           int64_t gqa_ratio, bool dropout, CostSources& sources) const {
  if (batch_heads <= 0 || seq <= 0 || head_dim <= 0) return 0;
  return attention_seconds(attention_backward_[causal], true, batch_heads, seq, head_dim, causal, gqa_ratio, dropout,
                           sources);
}

double Profile::attention_block_seconds(const Kernel& block, CostSources& sources) const {
  const int64_t batch_heads = block.batch * block.heads;
  if (batch_heads <= 0 || block.seq <= 0 || block.head_dim <= 0) return 0;
  const bool backward = block.kind == KernelKind::kAttentionBlockBackward;
  const AttentionTablesByDropout& tables = (backward ? ring_block_backward_ : ring_block_forward_)[block.diagonal];
  const int64_t ratio = gqa_ratio(block);
  if (!tables[0].empty() || !tables[1].empty()) {
    return attention_seconds(tables, backward, batch_heads, block.seq, block.head_dim, block.diagonal, ratio,
                             block.dropout, sources);
  }
  CostSources whole;
  const double diagonal = attention_seconds(backward ? attention_backward_[true] : attention_forward_[true], backward,
                                            batch_heads, block.seq, block.head_dim, true, ratio, block.dropout, whole);
  ++sources.fallback;
  return block.diagonal ? diagonal : 2 * diagonal;
}

double Profile::elementwise_seconds(int64_t bytes, CostSources& sources) const {
  if (bytes <= 0) return 0;
  if (!elementwise_.points.empty()) {
    ++sources.table;
    return seconds_from_curve(elementwise_, log_of(bytes));
  }
  ++sources.fallback;
  return static_cast<double>(bytes) / (device_.memory_bandwidth_bytes_per_s * curve_.memory_efficiency) +
         device_.kernel_launch_s;
}

double Profile::memory_kernel_seconds(const std::string& kernel_class, int64_t bytes, CostSources& sources) const {
  if (bytes <= 0) return 0;
  const auto found = memory_kernels_.find(kernel_class);
  if (found != memory_kernels_.end()) {
    ++sources.table;
    return seconds_from_curve(found->second, log_of(bytes));
  }
  // A streaming pass (kElementwise) is what the `elementwise` table or the residual add's curve
  // measures; any other class answered so is a fallback (entries of a nearby kind).
  const bool streaming = kernel_class == "elementwise";
  CostSources answered;
  double seconds = 0;
  const auto add = memory_kernels_.find("add");
  if (elementwise_.points.empty() && add != memory_kernels_.end()) {
    ++answered.table;
    seconds = seconds_from_curve(add->second, log_of(bytes));
  } else {
    seconds = elementwise_seconds(bytes, answered);
  }
  if (streaming) {
    sources.table += answered.table;
    sources.fallback += answered.fallback;
  } else {
    ++sources.fallback;
  }
  return seconds;
}

double Profile::kernel_seconds(const Kernel& kernel, CostSources& sources) const {
  return kernel_answers_.get(kernel, sources, [this](const Kernel& k, CostSources& counted) {
    return unremembered_kernel_seconds(k, counted);
  });
}

double Profile::unremembered_kernel_seconds(const Kernel& kernel, CostSources& sources) const {
  switch (kernel.kind) {
    case KernelKind::kGemm: {
      // A strided-batched GEMM as one GEMM of all its rows: the same FLOPs and operand tiles.
      const int64_t rows = kernel.m * std::max<int64_t>(1, kernel.batch);
      return gemm_seconds(kernel.layout, kernel.epilogue, rows, kernel.n, kernel.k, kernel.precision, sources);
    }
    case KernelKind::kAttentionForward:
      return attention_forward_seconds(kernel.batch * kernel.heads, kernel.seq, kernel.head_dim, true,
                                       gqa_ratio(kernel), kernel.dropout, sources);
    case KernelKind::kAttentionBackward:
      return attention_backward_seconds(kernel.batch * kernel.heads, kernel.seq, kernel.head_dim, true,
                                        gqa_ratio(kernel), kernel.dropout, sources);
    case KernelKind::kAttentionBlockForward:
    case KernelKind::kAttentionBlockBackward: return attention_block_seconds(kernel, sources);
    default: return memory_kernel_seconds(memory_kernel_class(kernel), kernel_bytes(kernel, 2), sources);
  }
}

double Profile::collective_seconds(CollectiveOp op, int64_t group_size, int64_t bytes, LinkKind link,
                                   const LinkParams& fallback_link, CostSources& sources) const {
  if (group_size <= 1 || bytes <= 0) return 0;
  const double factor = bus_bandwidth_factor(op, group_size);
  const auto found = collectives_.find({op, group_size, link});
  if (found != collectives_.end()) {
    ++sources.table;
    const Curve& bus_bandwidth = found->second;
    const auto& [smallest_log_bytes, smallest_log_bus_bandwidth] = bus_bandwidth.points.front();
    const double log_bytes = log_of(bytes);
    // Below the smallest measurement its time, as for the other curves: a clamped bus bandwidth
    // would let the time fall to zero, under the latency the table shows. Above the largest,
    // its bus bandwidth.
    if (log_bytes < smallest_log_bytes) return std::exp(smallest_log_bytes - smallest_log_bus_bandwidth) * factor;
    return static_cast<double>(bytes) * factor / std::exp(bus_bandwidth.at(log_bytes));
  }
  ++sources.fallback;
  const double transfer =
      static_cast<double>(bytes) * factor / (fallback_link.bandwidth_bytes_per_s * curve_.link_efficiency);
  const double ring = static_cast<double>(ring_steps(op, group_size)) * fallback_link.latency_s + transfer;
  if (op != CollectiveOp::kAllReduce || link != LinkKind::kNetwork) return ring;
  // Across nodes NCCL also runs all-reduce on a (double binary) tree of the nodes: the same bytes
  // per GPU, but a latency per level up and down rather than per ring step; it picks the faster,
  // and so does this. Inside a node its tree is a chain, so the ring stands.
  const double levels = std::ceil(std::log2(static_cast<double>(group_size)));
  return std::min(ring, 2 * levels * fallback_link.latency_s + transfer);
}

double Profile::p2p_seconds(int64_t bytes, LinkKind link, const LinkParams& fallback_link, CostSources& sources) const {
  if (bytes <= 0) return 0;
  const Curve& curve = p2p_[static_cast<std::size_t>(link)];
  if (!curve.points.empty()) {
    ++sources.table;
    return seconds_from_curve(curve, log_of(bytes));
  }
  ++sources.fallback;
  return fallback_link.latency_s +
         static_cast<double>(bytes) / (fallback_link.bandwidth_bytes_per_s * curve_.link_efficiency);
}

double Profile::slowdown_lookup(const SlowdownTable& table, CollectiveOp op, int64_t group_size, LinkKind link) {
  double best = 0;
  double nearest = -1;
  for (auto it = table.lower_bound({op, link, 0}); it != table.end(); ++it) {
    const auto& [entry_op, entry_link, entry_group] = it->first;
    if (entry_op != op || entry_link != link) break;
    const double distance = std::abs(std::log2(static_cast<double>(entry_group) / static_cast<double>(group_size)));
    if (nearest < 0 || distance <= nearest) {  // ascending group sizes: a tie keeps the larger
      nearest = distance;
      best = it->second;
    }
  }
  return best;
}

OverlapSlowdown Profile::overlap_slowdown(CollectiveOp op, int64_t group_size, LinkKind link) const {
  if (group_size <= 1) return {};
  return {slowdown_lookup(compute_slowdown_, op, group_size, link),
          slowdown_lookup(collective_slowdown_, op, group_size, link)};
}

OverlapSlowdown Profile::p2p_overlap_slowdown(LinkKind link) const {
  return {slowdown_lookup(compute_slowdown_, CollectiveOp::kSendRecv, 2, link),
          slowdown_lookup(collective_slowdown_, CollectiveOp::kSendRecv, 2, link)};
}

// A ring all-reduce sends each byte 2(n-1)/n times, all-gather, reduce-scatter and all-to-all (n-1)/n.
double bus_bandwidth_factor(CollectiveOp op, int64_t n) {
  const double steps = static_cast<double>(n - 1) / static_cast<double>(n);
  return op == CollectiveOp::kAllReduce ? 2 * steps : steps;
}

ProfileKind Profile::kind() const {
  const bool measured = !gemm_.empty() || !memory_kernels_.empty() || !elementwise_.points.empty() ||
                        !collectives_.empty() || !p2p_[0].points.empty() || !p2p_[1].points.empty() ||
                        !compute_slowdown_.empty() || !attention_forward_[0][0].empty() ||
                        !attention_forward_[1][0].empty() || !attention_forward_[0][1].empty() ||
                        !attention_forward_[1][1].empty();
  if (!measured) return ProfileKind::kDatasheet;
  return transferred_from_.empty() ? ProfileKind::kMeasured : ProfileKind::kTransferred;
}

std::string to_string(ProfileKind kind) {
  switch (kind) {
    case ProfileKind::kMeasured: return "measured";
    case ProfileKind::kTransferred: return "transferred";
    case ProfileKind::kDatasheet: return "datasheet";
  }
  return "?";
}
std::string to_string(LinkKind link) { return name_of(link, kLinks); }

}  // namespace megaplan::sim
