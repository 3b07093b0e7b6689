// Transferred profiles against hand arithmetic: peaks, bandwidths, wave quantisation by SM count,
// the launch gap that does not scale, links dropped, the kind and uncertainty stated.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "core/cluster_spec.h"
#include "core/error.h"
#include "simulator/profile.h"
#include "simulator/profile_transfer.h"
#include "tests/simulator/round_profile.h"

using megaplan::DType;
using megaplan::sim::CostSources;
using megaplan::sim::Profile;

namespace {

megaplan::GpuSpec gpu(const std::string& name, double peak, double bandwidth, int64_t sms) {
  return {name, peak, peak, 80'000'000'000, bandwidth, sms};
}

// A measured profile of "from": 1 us launch gap, one GEMM, one attention point, one kernel curve,
// one collective.
nlohmann::json measured() {
  nlohmann::json json = megaplan::test::round_profile("from", 4e12);
  json["uncertainty"] = 0.03;
  json["gemm"] = {
      {{"m", 1024}, {"n", 1024}, {"k", 4096}, {"dtype", "bf16"}, {"seconds", 21e-6}},
      {{"m", 1024}, {"n", 1024}, {"k", 4096}, {"dtype", "bf16"}, {"layout", "weight_gradient"}, {"seconds", 0.5e-6}}};
  json["attention"] = {{{"batch_heads", 16},
                        {"seq", 1024},
                        {"head_dim", 128},
                        {"causal", true},
                        {"forward_s", 11e-6},
                        {"backward_s", 31e-6}}};
  json["kernels"] = {{{"kernel", "add"}, {"bytes", 1 << 20}, {"seconds", 5e-6}}};
  json["collectives"] = {{{"op", "all_reduce"},
                          {"group_size", 2},
                          {"link", "nvlink"},
                          {"bytes", 1 << 20},
                          {"bus_bandwidth_bytes_per_s", 1e11}}};
  return json;
}

}  // namespace

TEST_CASE("a transfer scales compute by the peaks with wave quantisation, memory by the bandwidths",
          "[simulator][profile]") {
  const megaplan::GpuSpec from = gpu("from", 1e15, 4e12, 132);
  const megaplan::GpuSpec to = gpu("to", 0.5e15, 2e12, 108);
  const nlohmann::json json = megaplan::sim::transfer_profile(measured(), "m.json", from, to);
  CHECK(json.at("gpu") == "to");
  CHECK_FALSE(json.contains("collectives"));
  CHECK(json.at("device").at("peak_bf16_flops_per_s") == 0.5e15);
  CHECK(json.at("device").at("memory_bandwidth_bytes_per_s") == 2e12);
  // 1024 x 1024 outputs in 128 x 128 tiles: 64 tiles, one wave on either GPU, filled 64/132 and
  // 64/108: the slower GPU's wave is fuller. 1 us of launch, then 20 us x 2 x (64/132)/(64/108).
  const double gemm = 1e-6 + 20e-6 * 2 * (108.0 / 132.0);
  CHECK(json.at("gemm")[0].at("seconds").get<double>() == Approx(gemm));
  // Under the launch gap nothing scales.
  CHECK(json.at("gemm")[1].at("seconds").get<double>() == Approx(0.5e-6));
  // Attention: 16 heads x 8 blocks of 128 queries = 128 blocks: one wave of 132, two of 108.
  const double waves = (128.0 / 132.0) / (128.0 / 216.0);
  CHECK(json.at("attention")[0].at("forward_s").get<double>() == Approx(1e-6 + 10e-6 * 2 * waves));
  CHECK(json.at("attention")[0].at("backward_s").get<double>() == Approx(1e-6 + 30e-6 * 2 * waves));
  CHECK(json.at("kernels")[0].at("seconds").get<double>() == Approx(1e-6 + 4e-6 * 2));

  const Profile profile = Profile::from_json(json, "t.json");
  CHECK(profile.kind() == megaplan::sim::ProfileKind::kTransferred);
  CHECK(megaplan::sim::to_string(profile.kind()) == "transferred");
  CHECK(profile.transferred_from() == "from");
  CHECK(profile.uncertainty() == megaplan::sim::kDatasheetUncertainty);  // another die: not validated
  CostSources sources;
  CHECK(profile.gemm_seconds(1024, 1024, 4096, DType::kBFloat16, sources) == Approx(gemm));
  // Links come from the link model now.
  CostSources links;
  (void)profile.collective_seconds(megaplan::CollectiveOp::kAllReduce, 2, 1 << 20, megaplan::sim::LinkKind::kNvlink,
                                   {1e11, 1e-6}, links);
  CHECK(links.fallback == 1);
}

TEST_CASE("a transfer between GPUs of one die states the validated uncertainty", "[simulator][profile]") {
  const megaplan::GpuSpec from = gpu("from", 1e15, 4e12, 132);
  const megaplan::GpuSpec to = gpu("to", 1e15, 5e12, 132);
  const Profile profile = Profile::from_json(megaplan::sim::transfer_profile(measured(), "m.json", from, to), "t.json");
  CHECK(profile.uncertainty() == megaplan::sim::kSameDieTransferUncertainty);
  CostSources sources;
  CHECK(profile.gemm_seconds(1024, 1024, 4096, DType::kBFloat16, sources) == Approx(21e-6));
}

TEST_CASE("a transfer refuses what is no measured profile of its GPU", "[simulator][profile]") {
  const megaplan::GpuSpec from = gpu("from", 1e15, 4e12, 132);
  const megaplan::GpuSpec other = gpu("other", 1e15, 4e12, 132);
  const auto error = [](const nlohmann::json& json, const megaplan::GpuSpec& source) {
    try {
      megaplan::sim::transfer_profile(json, "m.json", source, gpu("to", 1e15, 4e12, 132));
    } catch (const megaplan::SpecError& caught) {
      return std::string(caught.what());
    }
    return std::string("no error");
  };
  CHECK(error(measured(), other) == "m.json: profiles from, not other");
  nlohmann::json tables_gone = measured();
  for (const char* key : {"gemm", "attention", "kernels", "collectives"}) tables_gone.erase(key);
  CHECK(error(tables_gone, from) == "m.json: holds no measured table to transfer (its kind is datasheet)");
  nlohmann::json bad = measured();
  bad["transferred_from"] = {{"gpu", ""}};
  CHECK(error(bad, from) == "m.json: transferred_from: gpu: must name the measured GPU, got \"\"");
}

TEST_CASE("the A100 gets the H100's built-in measured tables, transferred", "[simulator][profile]") {
  const std::optional<Profile> a100 =
      megaplan::sim::builtin_transferred_profile(megaplan::cluster_preset("dgx-a100-80gb").gpu);
  REQUIRE(a100);
  CHECK(a100->gpu_name() == "A100-SXM4-80GB");
  CHECK(a100->transferred_from() == "H100-SXM5-80GB");
  CHECK(a100->kind() == megaplan::sim::ProfileKind::kTransferred);
  CHECK(megaplan::sim::builtin_transfer_source(megaplan::cluster_preset("dgx-a100-80gb").gpu)->name ==
        "H100-SXM5-80GB");
  CHECK_FALSE(megaplan::sim::builtin_transferred_profile(megaplan::cluster_preset("dgx-h100").gpu));
  CHECK_FALSE(megaplan::sim::builtin_transfer_source(megaplan::cluster_preset("dgx-h100").gpu));
}
