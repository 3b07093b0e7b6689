// Profile: how long kernels and transfers take on one GPU type — measured tables (the profiler
// fills them) interpolated in log space, and where no table covers a request a roofline with a
// documented efficiency curve. Every lookup counts where its answer came from, so outputs can say
// how much of a simulation rests on the fallback. Schema: profiles/README.md.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/cluster_spec.h"
#include "core/collective.h"
#include "core/dtype.h"
#include "core/gemm.h"
#include "core/kernel_list.h"
#include "simulator/cost_sources.h"
#include "simulator/kernel_seconds_memo.h"
#include "simulator/overlap.h"

namespace megaplan::sim {

enum class LinkKind : uint8_t { kNvlink, kNetwork };
// Whether a profile holds measured tables (`megaplan profile`), another GPU's measured tables
// carried over to this one (profile_transfer.h), or only datasheet rates.
enum class ProfileKind : uint8_t { kMeasured, kTransferred, kDatasheet };

// A link as the cluster spec describes it, for the fallback: per direction, per GPU.
struct LinkParams {
  double bandwidth_bytes_per_s = 0;
  double latency_s = 0;
};

struct DeviceRates {
  double peak_bf16_flops_per_s = 0;  // dense tensor-core peak, no sparsity
  double peak_fp32_flops_per_s = 0;  // fp32 GEMMs as TF32 on tensor cores, dense
  double memory_bandwidth_bytes_per_s = 0;
  double kernel_launch_s = 0;  // gap between dependent kernels, added to every fallback kernel
  bool operator==(const DeviceRates&) const = default;
};

// The fallback's efficiency curve: a kernel of f FLOPs reaches max * f / (f + half) of peak
// (small kernels are bound by launch and tail effects), and never beats its bytes over
// `memory_efficiency` of the memory bandwidth. Links reach `link_efficiency` of their rate.
struct RooflineCurve {
  double gemm_max_efficiency = 0;
  double gemm_half_efficiency_flops = 0;
  double attention_max_efficiency = 0;
  double attention_half_efficiency_flops = 0;
  double memory_efficiency = 0;
  double link_efficiency = 0;
  bool operator==(const RooflineCurve&) const = default;
};

// The curve the datasheet profiles use; every constant is an assumption (profiles/README.md).
RooflineCurve default_roofline_curve();
// The launch gap the datasheet profiles assume.
constexpr double kDatasheetKernelLaunchS = 3e-6;
// The datasheet profiles' stated uncertainty: on the lent H100 and H200 they predicted megaplan's
// single-GPU iterations 15-20% fast (docs/results.md).
constexpr double kDatasheetUncertainty = 0.20;

// How well a measured table's interpolation holds between its points: each point predicted from
// the others of its table (leave one out), as the relative error |predicted - measured| / measured.
struct InterpolationCheck {
  std::string table;  // "gemm bf16 forward none", "attention forward causal gqa 1", ...
  int64_t points = 0;
  double median_error = 0;
  double p95_error = 0;  // the 95th percentile (nearest rank)
  double max_error = 0;
  std::string worst;  // the worst point's shape, "m 4096 n 1280 k 5120" or "batch_heads 16 seq 2048 head_dim 64"
};

// Lookups are const and allocate nothing, so one Profile serves many simulations on many threads.
// A kernel or transfer with no work (a size <= 0) takes 0 s and is not counted.
class Profile {
 public:
  // Throws SpecError naming the JSON field ("FILE: gemm[3]: seconds") and the rule.
  static Profile from_json(const nlohmann::json& json, const std::string& source);
  static Profile load(const std::string& path);
  // Roofline only, from core's datasheet numbers, with default_roofline_curve() and
  // kDatasheetKernelLaunchS: the same profile as the shipped profiles/*.datasheet.json.
  static Profile datasheet(const GpuSpec& gpu);
  // Every field as bytes and back, exactly (simulator/profile_bytes.cc): how the built-in profiles
  // are compiled into the binary, read at start with no JSON parse (builtin_profiles.h). Not a file
  // format: the bytes hold only within the build that wrote them. from_bytes trusts its input.
  std::string to_bytes() const;
  static Profile from_bytes(std::string_view bytes);
  bool operator==(const Profile&) const = default;

  const std::string& gpu_name() const { return gpu_; }
  const std::string& source() const { return source_; }
  // Where it was read from: the file, "profiles/<file> (built in)", or "datasheet" for datasheet().
  const std::string& origin() const { return origin_; }
  // Transferred when it says so (`transferred_from`), else measured when any table has an entry.
  ProfileKind kind() const;
  // The measured GPU a transferred profile's tables come from; empty otherwise.
  const std::string& transferred_from() const { return transferred_from_; }
  // The relative error to expect of an iteration time predicted with this profile, as its author
  // validated it ("uncertainty"); 0 where none is stated.
  double uncertainty() const { return uncertainty_; }
  const DeviceRates& device() const { return device_; }
  const RooflineCurve& roofline_curve() const { return curve_; }

  // X[m x k] W[k x n]: 2mnk FLOPs, the forward product without an epilogue.
  double gemm_seconds(int64_t m, int64_t n, int64_t k, DType dtype, CostSources& sources) const;
  // A linear layer's product in one of its three training layouts, (m, n, k) its forward shape
  // (core/kernel_list.h), with an epilogue. Measured entries of the same layout and epilogue are
  // blended; without any, those of the layout; without those, the forward table at the product's
  // own shape; then the roofline.
  double gemm_seconds(GemmLayout layout, GemmEpilogue epilogue, int64_t m, int64_t n, int64_t k, DType dtype,
                      CostSources& sources) const;
  // Flash attention over `batch_heads` sequences of `seq` tokens with head dimension `head_dim`,
  // bf16, `gqa_ratio` query heads sharing each key-value head (1: multi-head attention):
  // 4 * batch_heads * seq^2 * head_dim FLOPs forward (half when causal), 2.5x that backward. The
  // measured entries of the nearest ratio in log2 (the larger of two as near) answer: grouping
  // changes the bytes a kernel moves and how its backward sums dK and dV, not its FLOPs.
  // `dropout`: the probabilities dropped inside the kernels (--attention-dropout), answered by the
  // entries measured so; a profile without any answers from those without, counted as a fallback
  // (the draws' cost unmeasured).
  double attention_forward_seconds(int64_t batch_heads, int64_t seq, int64_t head_dim, bool causal, int64_t gqa_ratio,
                                   bool dropout, CostSources& sources) const;
  double attention_backward_seconds(int64_t batch_heads, int64_t seq, int64_t head_dim, bool causal, int64_t gqa_ratio,
                                    bool dropout, CostSources& sources) const;
  // One block of context parallelism's ring (kAttentionBlockForward/Backward): `chunk` queries
  // against `chunk` keys, masked causally on the diagonal, else unmasked, merged into an fp32
  // output. The measured ring-block entries answer; without them, counted as a fallback, a
  // diagonal block is the whole causal attention over `chunk` tokens and an unmasked one twice
  // that (twice the work, without the mask's ragged tiles).
  double attention_block_seconds(const Kernel& block, CostSources& sources) const;
  // A memory-bound pass moving `bytes` (reads plus writes).
  double elementwise_seconds(int64_t bytes, CostSources& sources) const;
  // A memory-bound kernel of a class of core's kernel lists (memory_kernel_class) moving `bytes`
  // (kernel_bytes): its class's measured curve; without one the `elementwise` table, then the
  // measured residual add's curve (a streaming pass like any), then the roofline — counted as a
  // fallback for any class but kElementwise's own.
  double memory_kernel_seconds(const std::string& kernel_class, int64_t bytes, CostSources& sources) const;
  // Any kernel of core's lists, with bf16 activations. Attention is causal. Each distinct kernel is
  // looked up once and its answer remembered (simulator/kernel_seconds_memo.h); safe from threads.
  double kernel_seconds(const Kernel& kernel, CostSources& sources) const;
  // NCCL's cost: `bytes` is the buffer (all-reduce: the whole tensor; all-gather: the gathered
  // output; reduce-scatter: the input; all-to-all: one rank's send buffer), moved as
  // bytes * factor / bus bandwidth with factor 2(n-1)/n for all-reduce and (n-1)/n otherwise;
  // the fallback adds the link latency once per ring step, or for an all-reduce across nodes per
  // tree level up and down where that is faster (NCCL's tree). A group of one takes 0 s.
  double collective_seconds(CollectiveOp op, int64_t group_size, int64_t bytes, LinkKind link,
                            const LinkParams& fallback_link, CostSources& sources) const;
  // One send/receive pair of `bytes`.
  double p2p_seconds(int64_t bytes, LinkKind link, const LinkParams& fallback_link, CostSources& sources) const;
  // What `op` (or, p2p_overlap_slowdown, a send/receive pair) on `link` and compute beside it cost
  // each other: each side from the `overlap` table's entries of the same op and link that measured
  // it (collective_slowdown is optional), the one whose group size is nearest in log2 (the larger of
  // two as near); 0 where none is measured (the datasheet profiles assume they cost each other nothing).
  OverlapSlowdown overlap_slowdown(CollectiveOp op, int64_t group_size, LinkKind link) const;
  OverlapSlowdown p2p_overlap_slowdown(LinkKind link) const;

  // The leave-one-out check of every GEMM and attention table of two points or more, in table
  // order (simulator/profile_leave_one_out.cc).
  std::vector<InterpolationCheck> leave_one_out() const;

 private:
  struct ShapePoint {  // a measured GEMM or attention shape, in log space
    std::array<double, 3> log_shape;
    double log_throughput;  // FLOPs per second
    double seconds;         // as measured, returned as is for this exact shape
    bool operator==(const ShapePoint&) const = default;
  };
  struct Curve {  // log(y) over log(bytes), sorted by bytes, distinct bytes
    std::vector<std::pair<double, double>> points;
    // Piecewise linear; clamped at both ends. REQUIRES: !points.empty()
    double at(double log_bytes) const;
    bool operator==(const Curve&) const = default;
  };

  // kernel_seconds without the memo.
  double unremembered_kernel_seconds(const Kernel& kernel, CostSources& sources) const;
  double shape_lookup(const std::vector<ShapePoint>& points, const std::array<double, 3>& log_shape, double flops,
                      double floor_s) const;
  double roofline(double flops, double peak, double max_efficiency, double half_flops, double bytes) const;
  // Measured attention entries by GQA ratio (query heads per key-value head).
  using AttentionTables = std::map<int64_t, std::vector<ShapePoint>>;
  using AttentionTablesByDropout = std::array<AttentionTables, 2>;  // without, with dropout
  // Either attention pass (`backward`) from `tables`, the whole attention's or the ring blocks':
  // its FLOPs and the bf16 tensors of batch_heads x seq x head_dim it moves (the roofline's bytes).
  // REQUIRES: batch_heads, seq, head_dim > 0.
  double attention_seconds(const AttentionTablesByDropout& tables, bool backward, int64_t batch_heads, int64_t seq,
                           int64_t head_dim, bool causal, int64_t gqa_ratio, bool dropout, CostSources& sources) const;
  static double seconds_from_curve(const Curve& curve, double log_bytes);

  std::string gpu_;
  std::string source_;
  std::string origin_;
  std::string transferred_from_;
  double uncertainty_ = 0;
  DeviceRates device_;
  RooflineCurve curve_;
  // By dtype, layout and epilogue; and by dtype and layout, every epilogue's entries together.
  std::map<std::tuple<DType, GemmLayout, GemmEpilogue>, std::vector<ShapePoint>> gemm_;
  std::map<std::pair<DType, GemmLayout>, std::vector<ShapePoint>> gemm_by_layout_;
  std::array<AttentionTablesByDropout, 2> attention_forward_;   // by causal, then dropout
  std::array<AttentionTablesByDropout, 2> attention_backward_;  // by causal, then dropout
  // The ring's blocks (`ring_block` entries), by diagonal (`causal`), then dropout.
  std::array<AttentionTablesByDropout, 2> ring_block_forward_;
  std::array<AttentionTablesByDropout, 2> ring_block_backward_;
  Curve elementwise_;                            // log seconds
  std::map<std::string, Curve> memory_kernels_;  // log seconds over log bytes, by kernel class
  std::map<std::tuple<CollectiveOp, int64_t, LinkKind>, Curve> collectives_;  // log bus bandwidth
  std::array<Curve, 2> p2p_;                                                  // log seconds, by LinkKind
  // The overlap table's two sides by op (send/receive included), link, group size; each holds
  // only the entries that measured it.
  using SlowdownTable = std::map<std::tuple<CollectiveOp, LinkKind, int64_t>, double>;
  SlowdownTable compute_slowdown_;
  SlowdownTable collective_slowdown_;
  static double slowdown_lookup(const SlowdownTable& table, CollectiveOp op, int64_t group_size, LinkKind link);
  // kernel_seconds' answers so far.
  KernelSecondsMemo kernel_answers_;
  // Visits every field in one order, for to_bytes and from_bytes.
  template <typename Profile_, typename Visit>
  static void visit_fields(Profile_& profile, Visit&& visit);
};

// NCCL's bus-bandwidth factor (nccl-tests, doc/PERFORMANCE.md): bus bandwidth = bytes x factor /
// time for a group of n.
double bus_bandwidth_factor(CollectiveOp op, int64_t n);

std::string to_string(LinkKind link);     // "nvlink", "network"
std::string to_string(ProfileKind kind);  // "measured", "transferred", "datasheet"

}  // namespace megaplan::sim
