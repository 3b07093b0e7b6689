// Profile lookups: exact hits, log-space interpolation, the roofline fallback and its counters,
// the shipped datasheet profiles, and refused fields.
#include <catch2/catch.hpp>

#include <cmath>

#include <nlohmann/json.hpp>

#include "core/cluster_spec.h"
#include "simulator/profile.h"

using Catch::Matchers::Contains;
using megaplan::sim::CollectiveOp;
using megaplan::sim::CostSources;
using megaplan::sim::DType;
using megaplan::sim::LinkKind;
using megaplan::sim::LinkParams;
using megaplan::sim::Profile;

namespace {

nlohmann::json base_profile() {
  return {{"schema", "megaplan-profile/1"},
          {"gpu", "H100-SXM5-80GB"},
          {"source", "test"},
          {"device", {{"peak_bf16_flops_per_s", 1e15}, {"memory_bandwidth_bytes_per_s", 2e12}, {"kernel_launch_s", 1e-6}}},
          {"roofline",
           {{"gemm_max_efficiency", 0.5},
            {"gemm_half_efficiency_flops", 1e9},
            {"attention_max_efficiency", 0.25},
            {"attention_half_efficiency_flops", 1e9},
            {"memory_efficiency", 0.5},
            {"link_efficiency", 0.5}}}};
}

}  // namespace

TEST_CASE("the roofline fallback follows its formula and is counted", "[simulator][profile]") {
  const Profile profile = Profile::from_json(base_profile(), "p.json");
  CostSources sources;
  // 8192^3: f = 1.1e12 FLOPs, efficiency 0.5 * f / (f + 1e9); compute-bound.
  const double f = 2.0 * 8192.0 * 8192.0 * 8192.0;
  CHECK(profile.gemm_seconds(8192, 8192, 8192, DType::kBf16, sources) ==
        Approx(f / (1e15 * 0.5 * f / (f + 1e9)) + 1e-6));
  // 1 x 8192 x 8192 is memory-bound: 2 bytes x (8192 + 8192^2 + 8192) over 0.5 x 2 TB/s.
  const double bytes = 2.0 * (8192.0 + 8192.0 * 8192.0 + 8192.0);
  CHECK(profile.gemm_seconds(1, 8192, 8192, DType::kBf16, sources) == Approx(bytes / 1e12 + 1e-6));
  // Causal attention: 4 * bh * s^2 * d / 2 FLOPs; the backward 2.5 times that.
  const double attention = 4.0 * 32 * 4096.0 * 4096.0 * 128 / 2;
  CHECK(profile.attention_forward_seconds(32, 4096, 128, true, sources) ==
        Approx(attention / (1e15 * 0.25 * attention / (attention + 1e9)) + 1e-6));
  CHECK(profile.attention_backward_seconds(32, 4096, 128, true, sources) ==
        Approx(2.5 * attention / (1e15 * 0.25 * 2.5 * attention / (2.5 * attention + 1e9)) + 1e-6));
  CHECK(profile.elementwise_seconds(1'000'000'000, sources) == Approx(1e9 / 1e12 + 1e-6));
  // Ring all-reduce of 1 GB over 8 GPUs on 100 GB/s links, 5 us per step:
  // 14 steps x 5 us + 1e9 x 2 x 7/8 / (0.5 x 100e9).
  const LinkParams link{100e9, 5e-6};
  CHECK(profile.collective_seconds(CollectiveOp::kAllReduce, 8, 1'000'000'000, LinkKind::kNvlink, link, sources) ==
        Approx(14 * 5e-6 + 1e9 * 2 * 7 / 8 / 50e9));
  CHECK(profile.collective_seconds(CollectiveOp::kAllGather, 8, 1'000'000'000, LinkKind::kNvlink, link, sources) ==
        Approx(7 * 5e-6 + 1e9 * 7 / 8 / 50e9));
  CHECK(profile.collective_seconds(CollectiveOp::kAllReduce, 1, 1'000'000'000, LinkKind::kNvlink, link, sources) == 0);
  CHECK(profile.p2p_seconds(1'000'000, LinkKind::kNetwork, link, sources) == Approx(5e-6 + 1e6 / 50e9));
  CHECK(sources.table == 0);
  CHECK(sources.fallback == 8);
}

TEST_CASE("measured tables win: exact hits and log-space interpolation", "[simulator][profile]") {
  nlohmann::json json = base_profile();
  json["gemm"] = {{{"m", 1024}, {"n", 1024}, {"k", 1024}, {"dtype", "bf16"}, {"seconds", 1e-5}},
                  {{"m", 4096}, {"n", 1024}, {"k", 1024}, {"dtype", "bf16"}, {"seconds", 2e-5}}};
  json["elementwise"] = {{{"bytes", 1000}, {"seconds", 1e-6}}, {{"bytes", 1000000}, {"seconds", 1e-4}}};
  json["collectives"] = {
      {{"op", "all_reduce"}, {"group_size", 8}, {"link", "nvlink"}, {"bytes", 1000000}, {"bus_bandwidth_bytes_per_s", 1e10}},
      {{"op", "all_reduce"}, {"group_size", 8}, {"link", "nvlink"}, {"bytes", 100000000}, {"bus_bandwidth_bytes_per_s", 1e11}}};
  json["p2p"] = {{{"link", "nvlink"}, {"bytes", 1000000}, {"seconds", 1e-5}}};
  const Profile profile = Profile::from_json(json, "p.json");
  CostSources sources;
  CHECK(profile.gemm_seconds(1024, 1024, 1024, DType::kBf16, sources) == Approx(1e-5));
  // Halfway (in log m) between the two measurements: throughputs 2.1e14 and 4.3e14 FLOP/s blend
  // geometrically to their mean, sqrt(2.1e14 * 4.3e14), applied to 2048x1024x1024's FLOPs.
  const double low = 2.0 * 1024 * 1024 * 1024 / 1e-5;
  const double high = 2.0 * 4096 * 1024 * 1024 / 2e-5;
  CHECK(profile.gemm_seconds(2048, 1024, 1024, DType::kBf16, sources) ==
        Approx(2.0 * 2048 * 1024 * 1024 / std::sqrt(low * high)));
  // Element-wise: geometric midpoint in bytes -> geometric midpoint in time; beyond the table,
  // its last bandwidth (1e6 bytes per 1e-4 s).
  CHECK(profile.elementwise_seconds(31623, sources) == Approx(1e-5).epsilon(1e-3));
  CHECK(profile.elementwise_seconds(10000000, sources) == Approx(1e-3));
  // Bus bandwidth at 1e7 bytes: the geometric mean of 1e10 and 1e11.
  const LinkParams unused{1, 1};
  CHECK(profile.collective_seconds(CollectiveOp::kAllReduce, 8, 10000000, LinkKind::kNvlink, unused, sources) ==
        Approx(1e7 * 2 * 7 / 8 / std::sqrt(1e10 * 1e11)));
  CHECK(profile.p2p_seconds(1000000, LinkKind::kNvlink, unused, sources) == Approx(1e-5));
  CHECK(sources.table == 6);
  // Tables that do not cover a request fall back: fp32 GEMMs, another group size, the network.
  CHECK(profile.gemm_seconds(1024, 1024, 1024, DType::kFp32, sources) > 0);
  CHECK(profile.collective_seconds(CollectiveOp::kAllReduce, 4, 1000000, LinkKind::kNvlink, {1e11, 1e-6}, sources) > 0);
  CHECK(profile.p2p_seconds(1000000, LinkKind::kNetwork, {1e11, 1e-6}, sources) > 0);
  CHECK(sources.fallback == 3);
}

TEST_CASE("the shipped datasheet profiles load and match the built-in ones", "[simulator][profile]") {
  for (const auto& [file, cluster] : {std::pair{"a100-sxm4-80gb", "dgx-a100-80gb"}, std::pair{"h100-sxm5-80gb", "dgx-h100"},
                                      std::pair{"h200-sxm-141gb", "dgx-h200"}}) {
    INFO(file);
    const Profile shipped = Profile::load(std::string(MEGAPLAN_PROFILES_DIR) + "/" + file + ".datasheet.json");
    const megaplan::GpuSpec gpu = megaplan::cluster_preset(cluster).gpu;
    const Profile built_in = Profile::datasheet(gpu);
    CHECK(shipped.gpu_name() == gpu.name);
    CHECK_THAT(shipped.source(), Contains("datasheet"));
    CostSources sources;
    CHECK(shipped.gemm_seconds(4096, 12288, 12288, DType::kBf16, sources) ==
          Approx(built_in.gemm_seconds(4096, 12288, 12288, DType::kBf16, sources)));
    CHECK(shipped.attention_backward_seconds(96, 2048, 128, true, sources) ==
          Approx(built_in.attention_backward_seconds(96, 2048, 128, true, sources)));
    CHECK(shipped.elementwise_seconds(123456789, sources) == Approx(built_in.elementwise_seconds(123456789, sources)));
  }
}

TEST_CASE("bad profile fields are refused with the field and the rule", "[simulator][profile]") {
  nlohmann::json json = base_profile();
  json["schema"] = "megaplan-profile/0";
  CHECK_THROWS_WITH(Profile::from_json(json, "p.json"), "p.json: schema: must be \"megaplan-profile/1\", got \"megaplan-profile/0\"");
  json = base_profile();
  json["gemm"] = {{{"m", 1024}, {"n", 1024}, {"k", 1024}, {"dtype", "bf16"}, {"seconds", -1}}};
  CHECK_THROWS_WITH(Profile::from_json(json, "p.json"), Contains("p.json: gemm[0]: seconds: must be a positive number"));
  json["gemm"] = {{{"m", 1024}, {"n", 1024}, {"k", 1024}, {"dtype", "fp8"}, {"seconds", 1}}};
  CHECK_THROWS_WITH(Profile::from_json(json, "p.json"), "p.json: gemm[0]: dtype: must be one of bf16, fp32; got \"fp8\"");
  json = base_profile();
  json["collectives"] = {{{"op", "broadcast"}, {"group_size", 8}, {"link", "nvlink"}, {"bytes", 1}, {"bus_bandwidth_bytes_per_s", 1}}};
  CHECK_THROWS_WITH(Profile::from_json(json, "p.json"), Contains("op: must be one of all_reduce, all_gather"));
  json = base_profile();
  json["device"].erase("memory_bandwidth_bytes_per_s");
  CHECK_THROWS_WITH(Profile::from_json(json, "p.json"), "p.json: device: memory_bandwidth_bytes_per_s: required field is missing");
  json = base_profile();
  json["roofline"]["gemm_max_efficiency"] = 1.5;
  CHECK_THROWS_WITH(Profile::from_json(json, "p.json"), Contains("gemm_max_efficiency: must be in (0, 1]"));
  json = base_profile();
  json["gemms"] = nlohmann::json::array();
  CHECK_THROWS_WITH(Profile::from_json(json, "p.json"), Contains("gemms"));
  CHECK_THROWS_WITH(Profile::load("/no/such/profile.json"), Contains("cannot read file"));
}
