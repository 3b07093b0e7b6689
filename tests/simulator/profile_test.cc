// Profile lookups: exact hits, log-space interpolation, the roofline fallback and its counters,
// the shipped datasheet profiles, and refused fields. Every expected number is computed by hand
// from the test profile's round constants.
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/cluster_spec.h"
#include "core/error.h"
#include "core/kernel_list.h"
#include "simulator/profile.h"
#include "tests/simulator/round_profile.h"

using Catch::Matchers::Contains;
using megaplan::CollectiveOp;
using megaplan::DType;
using megaplan::sim::CostSources;
using megaplan::sim::LinkKind;
using megaplan::sim::LinkParams;
using megaplan::sim::Profile;

namespace {

// Round numbers: 1 PFLOP/s, 2 TB/s, 1 us launches, efficiencies of one half and one quarter.
nlohmann::json base_profile() { return megaplan::test::round_profile("H100-SXM5-80GB", 2e12); }

std::string error_of(const nlohmann::json& json) {
  try {
    Profile::from_json(json, "p.json");
  } catch (const megaplan::SpecError& error) {
    return error.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("the roofline fallback follows its formula and is counted", "[simulator][profile]") {
  const Profile profile = Profile::from_json(base_profile(), "p.json");
  CostSources sources;
  // 8192^3: f = 1.1e12 FLOPs at 0.5 * f / (f + 1e9) of peak; compute-bound.
  const double f = 2.0 * 8192.0 * 8192.0 * 8192.0;
  CHECK(profile.gemm_seconds(8192, 8192, 8192, DType::kBFloat16, sources) ==
        Approx(f / (1e15 * 0.5 * f / (f + 1e9)) + 1e-6));
  // 1 x 8192 x 8192 is memory-bound: 2 bytes x (8192 + 8192^2 + 8192) over 0.5 x 2 TB/s.
  const double bytes = 2.0 * (8192.0 + 8192.0 * 8192.0 + 8192.0);
  CHECK(profile.gemm_seconds(1, 8192, 8192, DType::kBFloat16, sources) == Approx(bytes / 1e12 + 1e-6));
  // fp32 without a stated peak: half the bf16 peak (TF32).
  CHECK(profile.gemm_seconds(8192, 8192, 8192, DType::kFloat32, sources) == Approx((f + 1e9) / (0.5e15 * 0.5) + 1e-6));
  // Causal attention: 4 * bh * s^2 * d / 2 FLOPs; the backward 2.5 times that.
  const double attention = 4.0 * 32 * 4096.0 * 4096.0 * 128 / 2;
  CHECK(profile.attention_forward_seconds(32, 4096, 128, true, 1, false, sources) ==
        Approx(attention / (1e15 * 0.25 * attention / (attention + 1e9)) + 1e-6));
  CHECK(profile.attention_backward_seconds(32, 4096, 128, true, 1, false, sources) ==
        Approx(2.5 * attention / (1e15 * 0.25 * 2.5 * attention / (2.5 * attention + 1e9)) + 1e-6));
  CHECK(profile.elementwise_seconds(1'000'000'000, sources) == Approx(1e9 / 1e12 + 1e-6));
  // All-reduce of 1 GB over 8 GPUs on 100 GB/s links, 5 us per step: 1e9 x 2 x 7/8 / (0.5 x 100e9)
  // on the wire, plus 14 ring steps inside a node; across nodes the tree's 3 levels up and down
  // (6 x 5 us) are fewer.
  const LinkParams link{100e9, 5e-6};
  CHECK(profile.collective_seconds(CollectiveOp::kAllReduce, 8, 1'000'000'000, LinkKind::kNvlink, link, sources) ==
        Approx(14 * 5e-6 + 1e9 * 2 * 7 / 8 / 50e9));
  CHECK(profile.collective_seconds(CollectiveOp::kAllReduce, 8, 1'000'000'000, LinkKind::kNetwork, link, sources) ==
        Approx(6 * 5e-6 + 1e9 * 2 * 7 / 8 / 50e9));
  // Two GPUs: ring and tree alike, 2 x 5 us.
  CHECK(profile.collective_seconds(CollectiveOp::kAllReduce, 2, 1'000'000'000, LinkKind::kNvlink, link, sources) ==
        Approx(2 * 5e-6 + 1e9 * 2 * 1 / 2 / 50e9));
  CHECK(profile.collective_seconds(CollectiveOp::kAllGather, 8, 1'000'000'000, LinkKind::kNvlink, link, sources) ==
        Approx(7 * 5e-6 + 1e9 * 7 / 8 / 50e9));
  CHECK(profile.collective_seconds(CollectiveOp::kReduceScatter, 4, 1'000'000'000, LinkKind::kNetwork, link, sources) ==
        Approx(3 * 5e-6 + 1e9 * 3 / 4 / 50e9));
  CHECK(profile.p2p_seconds(1'000'000, LinkKind::kNetwork, link, sources) == Approx(5e-6 + 1e6 / 50e9));
  CHECK(sources.table == 0);
  CHECK(sources.fallback == 12);
}

TEST_CASE("a small GEMM runs at the curve's fraction of peak", "[simulator][profile]") {
  nlohmann::json json = base_profile();
  json["device"]["memory_bandwidth_bytes_per_s"] = 1e16;  // keep memory out of the way
  json["device"]["peak_fp32_flops_per_s"] = 1e14;
  const Profile profile = Profile::from_json(json, "p.json");
  CostSources sources;
  // 500 x 1000 x 1000 is exactly gemm_half_efficiency_flops = 1e9: half of 0.5, so 1e9 / 2.5e14.
  CHECK(profile.gemm_seconds(500, 1000, 1000, DType::kBFloat16, sources) == Approx(4e-6 + 1e-6));
  // 1024^3 = 2^31 FLOPs: (f + 1e9) / (1e15 x 0.5).
  CHECK(profile.gemm_seconds(1024, 1024, 1024, DType::kBFloat16, sources) == Approx(3.147483648e9 / 5e14 + 1e-6));
  // A stated fp32 peak is used as is.
  CHECK(profile.gemm_seconds(500, 1000, 1000, DType::kFloat32, sources) == Approx(1e9 / (1e14 * 0.25) + 1e-6));
  CHECK(sources.fallback == 3);
}

TEST_CASE("GEMM tables: exact hits win, other shapes blend throughput in log space", "[simulator][profile]") {
  nlohmann::json json = base_profile();
  json["gemm"] = {{{"m", 4096}, {"n", 1024}, {"k", 1024}, {"dtype", "bf16"}, {"seconds", 2e-5}},
                  {{"m", 1024}, {"n", 1024}, {"k", 1024}, {"dtype", "bf16"}, {"seconds", 1e-5}}};
  const Profile profile = Profile::from_json(json, "p.json");
  CostSources sources;
  CHECK(profile.gemm_seconds(1024, 1024, 1024, DType::kBFloat16, sources) == 1e-5);
  CHECK(profile.gemm_seconds(4096, 1024, 1024, DType::kBFloat16, sources) == 2e-5);
  const double low = 2.0 * 1024 * 1024 * 1024 / 1e-5;   // 2.1e14 FLOP/s
  const double high = 2.0 * 4096 * 1024 * 1024 / 2e-5;  // 4.3e14 FLOP/s
  // Halfway in log m, equal weights: the geometric mean throughput, applied to 2048x1024x1024.
  CHECK(profile.gemm_seconds(2048, 1024, 1024, DType::kBFloat16, sources) ==
        Approx(2.0 * 2048 * 1024 * 1024 / std::sqrt(low * high)));
  // Anywhere between, the throughput lies between the two measured ones.
  const double flops_3000 = 2.0 * 3000 * 1024 * 1024;
  const double seconds_3000 = profile.gemm_seconds(3000, 1024, 1024, DType::kBFloat16, sources);
  CHECK(seconds_3000 > flops_3000 / high);
  CHECK(seconds_3000 < flops_3000 / low);
  // Beyond the table, m = 8192 is (ln 2)^2 from 4096 and (3 ln 2)^2 from 1024: weights 9 : 1.
  CHECK(profile.gemm_seconds(8192, 1024, 1024, DType::kBFloat16, sources) ==
        Approx(2.0 * 8192 * 1024 * 1024 / (std::pow(high, 0.9) * std::pow(low, 0.1))));
  CHECK(sources.table == 5);
  CHECK(sources.fallback == 0);
  // No fp32 entry: the roofline, counted as such.
  CHECK(profile.gemm_seconds(1024, 1024, 1024, DType::kFloat32, sources) > 0);
  CHECK(sources.fallback == 1);
}

TEST_CASE("a kernel asked again gets the same answer and counts its sources again, from any thread",
          "[simulator][profile]") {
  nlohmann::json json = base_profile();
  json["gemm"] = {{{"m", 4096}, {"n", 1024}, {"k", 1024}, {"dtype", "bf16"}, {"seconds", 2e-5}},
                  {{"m", 1024}, {"n", 1024}, {"k", 1024}, {"dtype", "bf16"}, {"seconds", 1e-5}}};
  const Profile profile = Profile::from_json(json, "p.json");
  const megaplan::Kernel between =
      megaplan::gemm_kernel(megaplan::GemmLayout::kForward, megaplan::GemmEpilogue::kNone, 3000, 1024, 1024);
  const megaplan::Kernel fp32 = [] {
    megaplan::Kernel kernel =
        megaplan::gemm_kernel(megaplan::GemmLayout::kForward, megaplan::GemmEpilogue::kNone, 1024, 1024, 1024);
    kernel.precision = DType::kFloat32;  // no fp32 table: the roofline
    return kernel;
  }();
  CostSources direct;
  const double interpolated = profile.gemm_seconds(3000, 1024, 1024, DType::kBFloat16, direct);
  const double roofline = profile.gemm_seconds(1024, 1024, 1024, DType::kFloat32, direct);
  // Asked from four threads at once, twice each: every answer the direct lookup's, every source counted.
  std::vector<CostSources> counted(4);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (CostSources& sources : counted) {
    threads.emplace_back([&] {
      for (int round = 0; round < 2; ++round) {
        if (profile.kernel_seconds(between, sources) != interpolated) wrong.fetch_add(1);
        if (profile.kernel_seconds(fp32, sources) != roofline) wrong.fetch_add(1);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(wrong.load() == 0);
  for (const CostSources& sources : counted) {
    CHECK(sources.table == 2);
    CHECK(sources.fallback == 2);
  }
  // A copy answers alike (it starts without the original's answers) and equals it.
  const Profile copy = profile;
  CostSources copied;
  CHECK(copy.kernel_seconds(between, copied) == interpolated);
  CHECK(copied.table == 1);
  CHECK(copy == profile);
}

TEST_CASE("attention tables by GQA ratio: the nearest ratio in log2 answers, the larger on a tie",
          "[simulator][profile]") {
  nlohmann::json json = base_profile();
  const auto entry = [](int64_t ratio, double forward_s) {
    nlohmann::json e = {{"batch_heads", 32},      {"seq", 2048},
                        {"head_dim", 128},        {"causal", true},
                        {"forward_s", forward_s}, {"backward_s", 2.5 * forward_s}};
    if (ratio > 0) e["gqa_ratio"] = ratio;
    return e;
  };
  json["attention"] = {entry(0, 1e-3), entry(4, 2e-3), entry(8, 3e-3)};  // no key: multi-head
  const Profile profile = Profile::from_json(json, "p.json");
  CostSources sources;
  CHECK(profile.attention_forward_seconds(32, 2048, 128, true, 1, false, sources) == 1e-3);
  CHECK(profile.attention_forward_seconds(32, 2048, 128, true, 4, false, sources) == 2e-3);
  CHECK(profile.attention_backward_seconds(32, 2048, 128, true, 8, false, sources) == 7.5e-3);
  CHECK(profile.attention_forward_seconds(32, 2048, 128, true, 2, false, sources) == 2e-3);   // 1 and 4 as near: 4
  CHECK(profile.attention_forward_seconds(32, 2048, 128, true, 5, false, sources) == 2e-3);   // nearer 4 than 8
  CHECK(profile.attention_forward_seconds(32, 2048, 128, true, 16, false, sources) == 3e-3);  // beyond the largest
  CHECK(sources.table == 6);
  // The kernel's own groups choose the table.
  CHECK(profile.kernel_seconds(megaplan::attention_kernel(megaplan::KernelKind::kAttentionForward, 2, 2048, 16, 128, 4),
                               sources) == 2e-3);
  CHECK(profile.kernel_seconds(megaplan::attention_kernel(megaplan::KernelKind::kAttentionForward, 2, 2048, 16, 128),
                               sources) == 1e-3);
  // The same shape and ratio twice is refused; a ratio must be a positive integer.
  json["attention"].push_back(entry(4, 5e-3));
  CHECK_THROWS_WITH(Profile::from_json(json, "p.json"),
                    Catch::Matchers::Contains("batch_heads, seq, head_dim, gqa_ratio, causal, dropout and ring_block"));
  json["attention"] = {entry(0, 1e-3)};
  json["attention"][0]["gqa_ratio"] = 0;
  CHECK_THROWS_WITH(Profile::from_json(json, "p.json"),
                    Catch::Matchers::Contains("p.json: attention[0]: gqa_ratio: must be a positive integer"));
}

TEST_CASE("attention with dropout: its own entries, else those without it, counted as a fallback",
          "[simulator][profile]") {
  nlohmann::json json = base_profile();
  const auto entry = [](bool dropout, double forward_s) {
    return nlohmann::json{{"batch_heads", 32},
                          {"seq", 2048},
                          {"head_dim", 128},
                          {"causal", true},
                          {"dropout", dropout},
                          {"forward_s", forward_s},
                          {"backward_s", 2 * forward_s}};
  };
  json["attention"] = {entry(false, 1e-3)};
  const Profile without = Profile::from_json(json, "p.json");
  CostSources sources;
  CHECK(without.attention_forward_seconds(32, 2048, 128, true, 1, true, sources) == 1e-3);
  CHECK(sources.fallback == 1);
  CHECK(sources.table == 0);
  json["attention"].push_back(entry(true, 1.5e-3));
  const Profile with = Profile::from_json(json, "p.json");
  sources = {};
  CHECK(with.attention_forward_seconds(32, 2048, 128, true, 1, true, sources) == 1.5e-3);
  CHECK(with.attention_backward_seconds(32, 2048, 128, true, 1, true, sources) == 3e-3);
  CHECK(with.attention_forward_seconds(32, 2048, 128, true, 1, false, sources) == 1e-3);
  CHECK(sources.table == 3);
  CHECK(sources.fallback == 0);
  // A kernel list's attention with dropout asks for those entries.
  CHECK(with.kernel_seconds(
            megaplan::attention_kernel(megaplan::KernelKind::kAttentionForward, 2, 2048, 16, 128, 16, true), sources) ==
        1.5e-3);
  json["attention"][1]["dropout"] = "yes";
  CHECK_THROWS_WITH(Profile::from_json(json, "p.json"), Catch::Matchers::Contains("attention[1]: dropout"));
}

TEST_CASE("the ring's blocks: their own entries, else the whole causal attention over a chunk, twice unmasked",
          "[simulator][profile]") {
  using megaplan::KernelKind;
  nlohmann::json json = base_profile();
  json["attention"] = {{{"batch_heads", 32},
                        {"seq", 2048},
                        {"head_dim", 128},
                        {"causal", true},
                        {"forward_s", 1e-3},
                        {"backward_s", 2e-3}}};
  const auto block = [](KernelKind kind, bool diagonal) {
    return megaplan::attention_block_kernel(kind, 2, 2048, 16, 128, 16, false, diagonal);
  };
  const Profile whole = Profile::from_json(json, "p.json");
  CostSources sources;
  CHECK(whole.kernel_seconds(block(KernelKind::kAttentionBlockForward, true), sources) == 1e-3);
  CHECK(whole.kernel_seconds(block(KernelKind::kAttentionBlockForward, false), sources) == 2e-3);
  CHECK(whole.kernel_seconds(block(KernelKind::kAttentionBlockBackward, true), sources) == 2e-3);
  CHECK(whole.kernel_seconds(block(KernelKind::kAttentionBlockBackward, false), sources) == 4e-3);
  CHECK(sources.fallback == 4);
  CHECK(sources.table == 0);
  // Measured blocks answer for themselves; the whole attention's entries stay the whole attention's.
  for (const bool diagonal : {true, false}) {
    json["attention"].push_back({{"batch_heads", 32},
                                 {"seq", 2048},
                                 {"head_dim", 128},
                                 {"causal", diagonal},
                                 {"ring_block", true},
                                 {"forward_s", diagonal ? 1.1e-3 : 1.7e-3},
                                 {"backward_s", diagonal ? 2.4e-3 : 3.9e-3}});
  }
  const Profile measured = Profile::from_json(json, "p.json");
  sources = {};
  CHECK(measured.kernel_seconds(block(KernelKind::kAttentionBlockForward, true), sources) == 1.1e-3);
  CHECK(measured.kernel_seconds(block(KernelKind::kAttentionBlockForward, false), sources) == 1.7e-3);
  CHECK(measured.kernel_seconds(block(KernelKind::kAttentionBlockBackward, true), sources) == 2.4e-3);
  CHECK(measured.kernel_seconds(block(KernelKind::kAttentionBlockBackward, false), sources) == 3.9e-3);
  CHECK(measured.attention_forward_seconds(32, 2048, 128, true, 1, false, sources) == 1e-3);
  CHECK(sources.table == 5);
  CHECK(sources.fallback == 0);
  json["attention"][1]["ring_block"] = 1;
  CHECK_THROWS_WITH(Profile::from_json(json, "p.json"), Catch::Matchers::Contains("attention[1]: ring_block"));
}

TEST_CASE("GEMM layouts and epilogues: their own entries, then the layout's, then the forward product",
          "[simulator][profile]") {
  using megaplan::GemmEpilogue;
  using megaplan::GemmLayout;
  nlohmann::json json = base_profile();
  json["gemm"] = {
      {{"m", 1024}, {"n", 1024}, {"k", 1024}, {"dtype", "bf16"}, {"seconds", 1e-5}},
      {{"m", 1024}, {"n", 1024}, {"k", 1024}, {"dtype", "bf16"}, {"epilogue", "bias_gelu"}, {"seconds", 3e-5}},
      {{"m", 1024},
       {"n", 4096},
       {"k", 1024},
       {"dtype", "bf16"},
       {"layout", "weight_gradient"},
       {"epilogue", "bias_gradient"},
       {"seconds", 8e-5}}};
  const Profile profile = Profile::from_json(json, "p.json");
  CostSources sources;
  // The absent "layout" and "epilogue" are the forward product without one.
  CHECK(profile.gemm_seconds(GemmLayout::kForward, GemmEpilogue::kNone, 1024, 1024, 1024, DType::kBFloat16, sources) ==
        1e-5);
  CHECK(profile.gemm_seconds(GemmLayout::kForward, GemmEpilogue::kBiasGelu, 1024, 1024, 1024, DType::kBFloat16,
                             sources) == 3e-5);
  // No bias entry of the forward layout: the layout's entries, both epilogues blended (equal weights).
  CHECK(profile.gemm_seconds(GemmLayout::kForward, GemmEpilogue::kBias, 2048, 1024, 1024, DType::kBFloat16, sources) ==
        Approx(2.0 * 2048 * 1024 * 1024 /
               std::sqrt((2.0 * 1024 * 1024 * 1024 / 1e-5) * (2.0 * 1024 * 1024 * 1024 / 3e-5))));
  // A weight gradient without its epilogue's entry takes the layout's.
  CHECK(profile.gemm_seconds(GemmLayout::kWeightGradient, GemmEpilogue::kNone, 1024, 4096, 1024, DType::kBFloat16,
                             sources) == 8e-5);
  // No input-gradient entry at all: the forward table at the product's own shape. dx = dy W for
  // the layer (m, n, k) = (1024, 4096, 1024) is a forward (1024, 1024, 4096): 4 x the FLOPs of
  // its nearest entries, at their (blended) throughput.
  const double seconds = profile.gemm_seconds(GemmLayout::kInputGradient, GemmEpilogue::kNone, 1024, 4096, 1024,
                                              DType::kBFloat16, sources);
  CHECK(seconds > 4 * 1e-5);
  CHECK(seconds < 4 * 3e-5);
  CHECK(sources.table == 5);
  CHECK(sources.fallback == 0);
}

TEST_CASE("memory-bound kernels: their class's curve, then the residual add's, then the roofline",
          "[simulator][profile]") {
  nlohmann::json json = base_profile();
  json["kernels"] = {{{"kernel", "adamw"}, {"bytes", 1000000}, {"seconds", 1e-5}},
                     {{"kernel", "adamw"}, {"bytes", 100000000}, {"seconds", 1e-4}},
                     {{"kernel", "add"}, {"bytes", 1000000}, {"seconds", 4e-6}}};
  const Profile profile = Profile::from_json(json, "p.json");
  CostSources sources;
  CHECK(profile.memory_kernel_seconds("adamw", 1000000, sources) == Approx(1e-5));
  CHECK(profile.memory_kernel_seconds("adamw", 10000000, sources) ==
        Approx(std::sqrt(1e-5 * 1e-4)));  // log-log halfway
  CHECK(sources.table == 2);
  // An unmeasured class takes the add's curve, counted as a fallback; a streaming pass is what it measures.
  CHECK(profile.memory_kernel_seconds("norm_forward", 1000000, sources) == Approx(4e-6));
  CHECK(sources.table == 2);
  CHECK(sources.fallback == 1);
  CHECK(profile.memory_kernel_seconds("elementwise", 1000000, sources) == Approx(4e-6));
  CHECK(sources.table == 3);
  // A kernel of core's list is costed by its class and bytes: 7 fp32 words and a bf16 copy per parameter.
  const megaplan::Kernel adamw = megaplan::flat_kernel(megaplan::KernelKind::kAdamw, 1000000 / 30);
  CHECK(profile.kernel_seconds(adamw, sources) ==
        Approx(profile.memory_kernel_seconds("adamw", 30 * (1000000 / 30), sources)));
  // Without any curve, the roofline: bytes over half of 2 TB/s, plus the launch.
  const Profile bare = Profile::from_json(base_profile(), "p.json");
  CostSources fallback;
  CHECK(bare.memory_kernel_seconds("fill", 1000000, fallback) == Approx(1e6 / 1e12 + 1e-6));
  CHECK(fallback.fallback == 1);
}

TEST_CASE("attention tables: per causal flag, scaled by FLOPs", "[simulator][profile]") {
  nlohmann::json json = base_profile();
  json["attention"] = {{{"batch_heads", 32},
                        {"seq", 2048},
                        {"head_dim", 128},
                        {"causal", true},
                        {"forward_s", 1e-3},
                        {"backward_s", 2.5e-3}}};
  const Profile profile = Profile::from_json(json, "p.json");
  CostSources sources;
  CHECK(profile.attention_forward_seconds(32, 2048, 128, true, 1, false, sources) == 1e-3);
  CHECK(profile.attention_backward_seconds(32, 2048, 128, true, 1, false, sources) == 2.5e-3);
  // The only measurement's throughput, applied to 4x the FLOPs (seq doubled).
  CHECK(profile.attention_forward_seconds(32, 4096, 128, true, 1, false, sources) == Approx(4e-3));
  CHECK(profile.attention_backward_seconds(32, 4096, 128, true, 1, false, sources) == Approx(1e-2));
  CHECK(sources.table == 4);
  const double full = 4.0 * 32 * 2048.0 * 2048.0 * 128;
  CHECK(profile.attention_forward_seconds(32, 2048, 128, false, 1, false, sources) ==
        Approx(full / (1e15 * 0.25 * full / (full + 1e9)) + 1e-6));
  CHECK(sources.fallback == 1);
}

TEST_CASE("byte curves: element-wise, p2p and collective bus bandwidth", "[simulator][profile]") {
  nlohmann::json json = base_profile();
  json["elementwise"] = {{{"bytes", 4096}, {"seconds", 4e-6}}, {{"bytes", 1024}, {"seconds", 1e-6}}};
  json["p2p"] = {{{"link", "nvlink"}, {"bytes", 1000000}, {"seconds", 1e-5}},
                 {{"link", "nvlink"}, {"bytes", 100000000}, {"seconds", 4e-4}}};
  json["collectives"] = {{{"op", "all_reduce"},
                          {"group_size", 8},
                          {"link", "nvlink"},
                          {"bytes", 1000000},
                          {"bus_bandwidth_bytes_per_s", 1e10}},
                         {{"op", "all_reduce"},
                          {"group_size", 8},
                          {"link", "nvlink"},
                          {"bytes", 100000000},
                          {"bus_bandwidth_bytes_per_s", 1e11}}};
  const Profile profile = Profile::from_json(json, "p.json");
  CostSources sources;
  const LinkParams unused{1, 1};

  // Element-wise: geometric midpoint in bytes, geometric midpoint in time; below the table its
  // smallest time, above it its last bandwidth (4096 bytes per 4 us).
  CHECK(profile.elementwise_seconds(1024, sources) == Approx(1e-6));
  CHECK(profile.elementwise_seconds(2048, sources) == Approx(2e-6));
  CHECK(profile.elementwise_seconds(100, sources) == Approx(1e-6));
  CHECK(profile.elementwise_seconds(8192, sources) == Approx(8e-6));

  // p2p: at 1e7 bytes the geometric mean of 1e-5 and 4e-4.
  CHECK(profile.p2p_seconds(1000000, LinkKind::kNvlink, unused, sources) == Approx(1e-5));
  CHECK(profile.p2p_seconds(10000000, LinkKind::kNvlink, unused, sources) == Approx(std::sqrt(1e-5 * 4e-4)));

  // All-reduce over 8: time = bytes x 2 x 7/8 / bus bandwidth, the bus bandwidth at 1e7 bytes
  // the geometric mean of 1e10 and 1e11; clamped above, the smallest time below.
  const auto all_reduce = [&](int64_t bytes) {
    return profile.collective_seconds(CollectiveOp::kAllReduce, 8, bytes, LinkKind::kNvlink, unused, sources);
  };
  CHECK(all_reduce(1000000) == Approx(1e6 * 1.75 / 1e10));
  CHECK(all_reduce(10000000) == Approx(1e7 * 1.75 / std::sqrt(1e10 * 1e11)));
  CHECK(all_reduce(1000000000) == Approx(1e9 * 1.75 / 1e11));
  CHECK(all_reduce(1000) == Approx(1e6 * 1.75 / 1e10));
  CHECK(sources.table == 10);
  CHECK(sources.fallback == 0);

  // Not covered: another op, group size or link, and p2p over the network.
  const LinkParams link{1e11, 1e-6};
  CHECK(profile.collective_seconds(CollectiveOp::kAllGather, 8, 1000000, LinkKind::kNvlink, link, sources) ==
        Approx(7e-6 + 1e6 * 7 / 8 / 5e10));
  CHECK(profile.collective_seconds(CollectiveOp::kAllReduce, 4, 1000000, LinkKind::kNvlink, link, sources) > 0);
  CHECK(profile.collective_seconds(CollectiveOp::kAllReduce, 8, 1000000, LinkKind::kNetwork, link, sources) > 0);
  CHECK(profile.p2p_seconds(1000000, LinkKind::kNetwork, link, sources) == Approx(1e-6 + 1e6 / 5e10));
  CHECK(sources.fallback == 4);
}

TEST_CASE("overlap slowdowns: the nearest measured group of the same op and link, each side on its own",
          "[simulator][profile]") {
  nlohmann::json json = base_profile();
  const Profile datasheet = Profile::from_json(json, "p.json");
  CHECK(datasheet.overlap_slowdown(CollectiveOp::kAllReduce, 8, LinkKind::kNvlink).compute == 0);  // nothing measured
  CHECK(datasheet.overlap_slowdown(CollectiveOp::kAllReduce, 8, LinkKind::kNvlink).collective == 0);
  // The collective's side is measured at group 2 only (an older four-GPU entry lacks it).
  json["overlap"] = {{{"op", "all_reduce"},
                      {"group_size", 2},
                      {"link", "nvlink"},
                      {"compute_slowdown", 0.05},
                      {"collective_slowdown", 0.5}},
                     {{"op", "all_reduce"}, {"group_size", 8}, {"link", "nvlink"}, {"compute_slowdown", 0.125}},
                     {{"op", "reduce_scatter"}, {"group_size", 4}, {"link", "nvlink"}, {"compute_slowdown", 0.25}},
                     {{"op", "send_recv"},
                      {"group_size", 2},
                      {"link", "nvlink"},
                      {"compute_slowdown", 0.01},
                      {"collective_slowdown", 0.75}}};
  const Profile profile = Profile::from_json(json, "p.json");
  CHECK(profile.kind() == megaplan::sim::ProfileKind::kMeasured);
  const auto compute = [&](CollectiveOp op, int64_t group, LinkKind link) {
    return profile.overlap_slowdown(op, group, link).compute;
  };
  CHECK(compute(CollectiveOp::kAllReduce, 2, LinkKind::kNvlink) == 0.05);
  CHECK(compute(CollectiveOp::kAllReduce, 8, LinkKind::kNvlink) == 0.125);
  CHECK(compute(CollectiveOp::kAllReduce, 3, LinkKind::kNvlink) == 0.05);   // log2: 2 is nearer than 8
  CHECK(compute(CollectiveOp::kAllReduce, 4, LinkKind::kNvlink) == 0.125);  // as near: the larger
  CHECK(compute(CollectiveOp::kAllReduce, 64, LinkKind::kNvlink) == 0.125);
  CHECK(compute(CollectiveOp::kReduceScatter, 16, LinkKind::kNvlink) == 0.25);
  CHECK(compute(CollectiveOp::kAllGather, 4, LinkKind::kNvlink) == 0);   // another op
  CHECK(compute(CollectiveOp::kAllReduce, 8, LinkKind::kNetwork) == 0);  // another link
  CHECK(compute(CollectiveOp::kAllReduce, 1, LinkKind::kNvlink) == 0);   // no group
  // The collective's side: the nearest group that measured it, whatever the compute's entries hold.
  CHECK(profile.overlap_slowdown(CollectiveOp::kAllReduce, 8, LinkKind::kNvlink).collective == 0.5);
  CHECK(profile.overlap_slowdown(CollectiveOp::kAllReduce, 2, LinkKind::kNvlink).collective == 0.5);
  CHECK(profile.overlap_slowdown(CollectiveOp::kReduceScatter, 4, LinkKind::kNvlink).collective == 0);
  CHECK(profile.overlap_slowdown(CollectiveOp::kAllReduce, 1, LinkKind::kNvlink).collective == 0);
  CHECK(profile.p2p_overlap_slowdown(LinkKind::kNvlink).compute == 0.01);
  CHECK(profile.p2p_overlap_slowdown(LinkKind::kNvlink).collective == 0.75);
  CHECK(profile.p2p_overlap_slowdown(LinkKind::kNetwork).compute == 0);
}

TEST_CASE("no work takes no time and is not counted", "[simulator][profile]") {
  const Profile profile = Profile::from_json(base_profile(), "p.json");
  CostSources sources;
  const LinkParams link{1e11, 1e-6};
  CHECK(profile.gemm_seconds(0, 1024, 1024, DType::kBFloat16, sources) == 0);
  CHECK(profile.attention_forward_seconds(32, 0, 128, true, 1, false, sources) == 0);
  CHECK(profile.attention_backward_seconds(0, 2048, 128, true, 1, false, sources) == 0);
  CHECK(profile.elementwise_seconds(0, sources) == 0);
  CHECK(profile.p2p_seconds(0, LinkKind::kNvlink, link, sources) == 0);
  CHECK(profile.collective_seconds(CollectiveOp::kAllReduce, 1, 1000000, LinkKind::kNvlink, link, sources) == 0);
  CHECK(profile.collective_seconds(CollectiveOp::kAllReduce, 8, 0, LinkKind::kNvlink, link, sources) == 0);
  CHECK(sources.table == 0);
  CHECK(sources.fallback == 0);
}

TEST_CASE("the shipped datasheet profiles load and match the built-in ones", "[simulator][profile]") {
  for (const auto& [file, cluster] :
       {std::pair{"a100-sxm4-80gb", "dgx-a100-80gb"}, std::pair{"h100-sxm5-80gb", "dgx-h100"},
        std::pair{"h200-sxm-141gb", "dgx-h200"}}) {
    INFO(file);
    const Profile shipped = Profile::load(std::string(MEGAPLAN_PROFILES_DIR) + "/" + file + ".datasheet.json");
    const megaplan::GpuSpec gpu = megaplan::cluster_preset(cluster).gpu;
    const Profile built_in = Profile::datasheet(gpu);
    CHECK(shipped.gpu_name() == gpu.name);
    CHECK(built_in.gpu_name() == gpu.name);
    CHECK_THAT(shipped.source(), Contains("datasheet"));
    CHECK_THAT(built_in.source(), Contains("datasheet"));
    CHECK(shipped.device().peak_bf16_flops_per_s == Approx(built_in.device().peak_bf16_flops_per_s));
    CHECK(shipped.device().peak_fp32_flops_per_s == Approx(built_in.device().peak_fp32_flops_per_s));
    CHECK(shipped.device().memory_bandwidth_bytes_per_s == Approx(built_in.device().memory_bandwidth_bytes_per_s));
    CHECK(shipped.device().kernel_launch_s == built_in.device().kernel_launch_s);
    CHECK(shipped.uncertainty() == built_in.uncertainty());
    CHECK(built_in.kind() == megaplan::sim::ProfileKind::kDatasheet);
    const auto& a = shipped.roofline_curve();
    const auto& b = built_in.roofline_curve();
    CHECK(a.gemm_max_efficiency == b.gemm_max_efficiency);
    CHECK(a.gemm_half_efficiency_flops == b.gemm_half_efficiency_flops);
    CHECK(a.attention_max_efficiency == b.attention_max_efficiency);
    CHECK(a.attention_half_efficiency_flops == b.attention_half_efficiency_flops);
    CHECK(a.memory_efficiency == b.memory_efficiency);
    CHECK(a.link_efficiency == b.link_efficiency);
    CostSources sources;
    CHECK(shipped.gemm_seconds(4096, 12288, 12288, DType::kBFloat16, sources) ==
          Approx(built_in.gemm_seconds(4096, 12288, 12288, DType::kBFloat16, sources)));
    CHECK(shipped.attention_backward_seconds(96, 2048, 128, true, 1, false, sources) ==
          Approx(built_in.attention_backward_seconds(96, 2048, 128, true, 1, false, sources)));
    CHECK(shipped.elementwise_seconds(123456789, sources) == Approx(built_in.elementwise_seconds(123456789, sources)));
    CHECK(sources.table == 0);  // datasheet profiles hold no tables
    CHECK(sources.fallback == 6);
  }
}

TEST_CASE("bad profile fields are refused with the field and the rule", "[simulator][profile]") {
  nlohmann::json json = base_profile();
  json["schema"] = "megaplan-profile/0";
  CHECK(error_of(json) == "p.json: schema: must be \"megaplan-profile/1\", got \"megaplan-profile/0\"");
  json = base_profile();
  json["gpu"] = "";
  CHECK(error_of(json) == "p.json: gpu: must name the GPU type, got \"\"");
  json = base_profile();
  json.erase("device");
  CHECK(error_of(json) == "p.json: device: required field is missing");
  json = base_profile();
  json["device"].erase("memory_bandwidth_bytes_per_s");
  CHECK(error_of(json) == "p.json: device: memory_bandwidth_bytes_per_s: required field is missing");
  json = base_profile();
  json["device"]["peak_fp32_flops_per_s"] = 0;
  CHECK(error_of(json) == "p.json: device: peak_fp32_flops_per_s: must be a positive number, got 0.0");
  json = base_profile();
  json["roofline"]["gemm_max_efficiency"] = 1.5;
  CHECK(error_of(json) == "p.json: roofline: gemm_max_efficiency: must be in (0, 1], got 1.5");
  json = base_profile();
  json["uncertainty"] = 1.5;
  CHECK(error_of(json) == "p.json: uncertainty: must be a fraction in [0, 1), got 1.5");
  json = base_profile();
  json["gemms"] = nlohmann::json::array();
  CHECK(error_of(json) == "p.json: gemms: unknown field");
  json = base_profile();
  json["gemm"] = nlohmann::json::object();
  CHECK(error_of(json) == "p.json: gemm: must be a JSON array");

  json = base_profile();
  json["gemm"] = {{{"m", 1024}, {"n", 1024}, {"k", 1024}, {"dtype", "bf16"}, {"seconds", -1}}};
  CHECK(error_of(json) == "p.json: gemm[0]: seconds: must be a positive number, got -1.0");
  json["gemm"] = {{{"m", 0}, {"n", 1024}, {"k", 1024}, {"dtype", "bf16"}, {"seconds", 1}}};
  CHECK(error_of(json) == "p.json: gemm[0]: m: must be a positive integer, got 0");
  json["gemm"] = {{{"m", 1024}, {"n", 1024}, {"k", 1024}, {"dtype", "fp8"}, {"seconds", 1}}};
  CHECK(error_of(json) == "p.json: gemm[0]: dtype: must be one of bf16, fp16, fp32; got \"fp8\"");
  json["gemm"] = {{{"m", 1024}, {"n", 1024}, {"k", 1024}, {"dtype", "bf16"}, {"seconds", 1}, {"flops", 1}}};
  CHECK(error_of(json) == "p.json: gemm[0]: flops: unknown field");
  json["gemm"] = {{{"m", 1024}, {"n", 1024}, {"k", 1024}, {"dtype", "bf16"}, {"seconds", 1}},
                  {{"m", 1024}, {"n", 1024}, {"k", 1024}, {"dtype", "bf16"}, {"seconds", 2}}};
  CHECK(error_of(json) == "p.json: gemm[1]: same m, n, k, dtype, layout and epilogue as gemm[0]");
  json["gemm"] = {{{"m", 1024}, {"n", 1024}, {"k", 1024}, {"dtype", "bf16"}, {"layout", "backward"}, {"seconds", 1}}};
  CHECK(error_of(json) ==
        "p.json: gemm[0]: layout: must be one of forward, input_gradient, weight_gradient; got \"backward\"");
  json["gemm"] = {{{"m", 1024}, {"n", 1024}, {"k", 1024}, {"dtype", "bf16"}, {"epilogue", "relu"}, {"seconds", 1}}};
  CHECK_THAT(error_of(json), Contains("p.json: gemm[0]: epilogue: must be one of none, bias, bias_gelu"));

  json = base_profile();
  json["kernels"] = {{{"kernel", "softmax"}, {"bytes", 1}, {"seconds", 1}}};
  CHECK_THAT(error_of(json), Contains("p.json: kernels[0]: kernel: must be one of norm_forward, add_norm_forward"));
  json["kernels"] = {{{"kernel", "adamw"}, {"bytes", 1}, {"seconds", 1}},
                     {{"kernel", "adamw"}, {"bytes", 1}, {"seconds", 2}}};
  CHECK(error_of(json) == "p.json: kernels[1]: same kernel and bytes as kernels[0]");
  json["kernels"] = {{{"kernel", "adamw"}, {"bytes", 1}}};
  CHECK(error_of(json) == "p.json: kernels[0]: seconds: required field is missing");

  json = base_profile();
  json["collectives"] = {
      {{"op", "broadcast"}, {"group_size", 8}, {"link", "nvlink"}, {"bytes", 1}, {"bus_bandwidth_bytes_per_s", 1}}};
  CHECK(error_of(json) ==
        "p.json: collectives[0]: op: must be one of all_reduce, all_gather, reduce_scatter, all_to_all; got "
        "\"broadcast\"");
  json["collectives"] = {
      {{"op", "all_gather"}, {"group_size", 1}, {"link", "nvlink"}, {"bytes", 1}, {"bus_bandwidth_bytes_per_s", 1}}};
  CHECK(error_of(json) == "p.json: collectives[0]: group_size: must be at least 2, got 1");
  json = base_profile();
  json["p2p"] = {{{"link", "pcie"}, {"bytes", 1}, {"seconds", 1}}};
  CHECK(error_of(json) == "p.json: p2p[0]: link: must be one of nvlink, network; got \"pcie\"");
  json["p2p"] = {{{"link", "nvlink"}, {"bytes", 1}, {"seconds", 1}},
                 {{"link", "nvlink"}, {"bytes", 1}, {"seconds", 2}}};
  CHECK(error_of(json) == "p.json: p2p[1]: same link and bytes as p2p[0]");
  json.erase("p2p");
  json["overlap"] = {{{"op", "broadcast"}, {"group_size", 2}, {"link", "nvlink"}, {"compute_slowdown", 0.1}}};
  CHECK(error_of(json) ==
        "p.json: overlap[0]: op: must be one of all_reduce, all_gather, reduce_scatter, all_to_all, send_recv; got "
        "\"broadcast\"");
  json["overlap"] = {{{"op", "all_reduce"}, {"group_size", 2}, {"link", "nvlink"}, {"compute_slowdown", -0.1}}};
  CHECK(error_of(json) == "p.json: overlap[0]: compute_slowdown: must be a number >= 0, got -0.1");
  json["overlap"] = {{{"op", "all_reduce"}, {"group_size", 1}, {"link", "nvlink"}, {"compute_slowdown", 0.1}}};
  CHECK(error_of(json) == "p.json: overlap[0]: group_size: must be at least 2, got 1");
  json["overlap"] = {{{"op", "all_reduce"}, {"group_size", 2}, {"link", "nvlink"}, {"compute_slowdown", 0.1}},
                     {{"op", "all_reduce"}, {"group_size", 2}, {"link", "nvlink"}, {"compute_slowdown", 0.2}}};
  CHECK(error_of(json) == "p.json: overlap[1]: same op, group_size and link as overlap[0]");
  json["overlap"] = {{{"op", "all_reduce"}, {"group_size", 2}, {"link", "nvlink"}}};
  CHECK(error_of(json).find("overlap[0]: compute_slowdown") != std::string::npos);
  json["overlap"] = {{{"op", "all_reduce"},
                      {"group_size", 2},
                      {"link", "nvlink"},
                      {"compute_slowdown", 0.1},
                      {"collective_slowdown", -1}}};
  CHECK(error_of(json) == "p.json: overlap[0]: collective_slowdown: must be a number >= 0, got -1.0");
  json = base_profile();
  json["attention"] = {{{"batch_heads", 1}, {"seq", 1}, {"head_dim", 1}, {"forward_s", 1}, {"backward_s", 1}}};
  CHECK(error_of(json) == "p.json: attention[0]: causal: required field is missing");

  CHECK_THROWS_WITH(Profile::load("/no/such/profile.json"), Contains("/no/such/profile.json: cannot read file"));
}

TEST_CASE("the shipped measured profiles load and cost a layer's kernels from their tables", "[simulator][profile]") {
  for (const auto& [file, cluster] :
       {std::pair{"h100-sxm5-80gb", "dgx-h100"}, std::pair{"h200-sxm-141gb", "dgx-h200"}}) {
    INFO(file);
    const Profile shipped = Profile::load(std::string(MEGAPLAN_PROFILES_DIR) + "/" + file + ".measured.json");
    CHECK(shipped.gpu_name() == megaplan::cluster_preset(cluster).gpu.name);
    CHECK_THAT(shipped.source(), Contains("measured: megaplan profile on NVIDIA H"));
    CHECK(shipped.kind() == megaplan::sim::ProfileKind::kMeasured);
    CHECK(shipped.uncertainty() > 0);  // stated from the validation runs in docs/results.md
    // gpt2-124m's qkv GEMM over 8192 tokens and its attention: measured, and a plausible fraction
    // of the 989 TFLOP/s dense peak (a unit or table mix-up would be off by orders of magnitude).
    CostSources sources;
    const double gemm = shipped.gemm_seconds(8192, 3 * 768, 768, DType::kBFloat16, sources);
    const double tflops = 2.0 * 8192 * 3 * 768 * 768 / gemm / 1e12;
    CHECK(tflops > 100);
    CHECK(tflops < 989.4);
    (void)shipped.attention_forward_seconds(96, 1024, 64, true, 1, false, sources);
    CHECK(sources.table == 2);
    CHECK(sources.fallback == 0);
  }
}

TEST_CASE("an interpolated GEMM is never faster than its bytes over the bandwidth", "[simulator][profile]") {
  nlohmann::json json = base_profile();  // 2 TB/s at memory efficiency 0.5
  // One compute-bound measurement: 8192^3 at 800 TFLOP/s.
  const double big = 2.0 * 8192.0 * 8192.0 * 8192.0;
  json["gemm"] = {{{"m", 8192}, {"n", 8192}, {"k", 8192}, {"dtype", "bf16"}, {"seconds", big / 8e14}}};
  const Profile profile = Profile::from_json(json, "p.json");
  CostSources sources;
  CHECK(profile.gemm_seconds(8192, 8192, 8192, DType::kBFloat16, sources) == Approx(big / 8e14));
  // 65536 x 2048 x 128 (unfused attention's scores): at the neighbour's throughput 43 us, but its
  // 2 x (65536*128 + 128*2048 + 65536*2048) bytes take 286 us at 1 TB/s.
  const double bytes = 2.0 * (65536.0 * 128 + 128.0 * 2048 + 65536.0 * 2048);
  CHECK(profile.gemm_seconds(65536, 2048, 128, DType::kBFloat16, sources) == Approx(bytes / 1e12));
  // A compute-bound interpolation keeps the throughput.
  const double half = 2.0 * 4096.0 * 8192.0 * 8192.0;
  CHECK(profile.gemm_seconds(4096, 8192, 8192, DType::kBFloat16, sources) == Approx(half / 8e14));
}

TEST_CASE("leave one out: each point predicted from the rest of its table", "[simulator][profile]") {
  nlohmann::json json = base_profile();
  // Three GEMMs at one throughput: any blend of the others predicts each exactly.
  const double rate = 4e14;
  const auto gemm = [rate](int64_t m, double slower) {
    return nlohmann::json{{"m", m},
                          {"n", 1024},
                          {"k", 1024},
                          {"dtype", "bf16"},
                          {"seconds", slower * 2.0 * static_cast<double>(m) * 1024 * 1024 / rate}};
  };
  json["gemm"] = {gemm(1024, 1), gemm(2048, 1), gemm(4096, 1)};
  // Attention: one point alone in its table is not checked.
  json["attention"] = {{{"batch_heads", 8},
                        {"seq", 1024},
                        {"head_dim", 64},
                        {"causal", true},
                        {"forward_s", 1e-5},
                        {"backward_s", 3e-5}}};
  std::vector<megaplan::sim::InterpolationCheck> checks = Profile::from_json(json, "p.json").leave_one_out();
  REQUIRE(checks.size() == 1);
  CHECK(checks[0].table == "gemm bf16 forward none");
  CHECK(checks[0].points == 3);
  CHECK(checks[0].max_error == Approx(0).margin(1e-12));

  // The middle one twice as slow as its neighbours: predicted from the ends (equal weights), half
  // its time: 50% off. Each end, from the slow middle (weight 1) and the far end (weight 1/4):
  // throughput 2^-0.8 of its own, time 2^0.8 of its own. The first end found is the worst.
  json["gemm"] = {gemm(1024, 1), gemm(2048, 2), gemm(4096, 1)};
  checks = Profile::from_json(json, "p.json").leave_one_out();
  REQUIRE(checks.size() == 1);
  const double end = std::pow(2.0, 0.8) - 1;
  CHECK(checks[0].max_error == Approx(end));
  CHECK(checks[0].worst == "m 1024 n 1024 k 1024");
  CHECK(checks[0].median_error == Approx(end));  // of 0.5, end, end
  CHECK(checks[0].p95_error == Approx(end));
  json["gemm"] = {gemm(1024, 1), gemm(2048, 1), gemm(4096, 1), gemm(8192, 1), gemm(16384, 3)};
  checks = Profile::from_json(json, "p.json").leave_one_out();
  REQUIRE(checks.size() == 1);
  CHECK(checks[0].worst == "m 16384 n 1024 k 1024");
  CHECK(checks[0].median_error < checks[0].p95_error);  // the far slow point alone is badly off
}
