// ClusterSpec: presets carry datasheet numbers, GPU selection rules, strict JSON.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "core/cluster_spec.h"
#include "core/error.h"

using Catch::Matchers::Contains;

namespace {
const std::string kExamples = MEGAPLAN_EXAMPLES_DIR;
}

TEST_CASE("presets validate and carry their datasheet numbers", "[cluster_spec]") {
  for (const megaplan::ClusterSpec& cluster : megaplan::cluster_presets()) {
    INFO(cluster.name);
    CHECK_NOTHROW(megaplan::validate_cluster_spec(cluster));
    CHECK_FALSE(cluster.source.empty());
  }
  const megaplan::ClusterSpec a100 = megaplan::cluster_preset("dgx-a100-80gb");
  CHECK(a100.gpus_per_node == 8);
  CHECK(a100.gpu.dense_bf16_flops_per_s == Approx(312e12));
  CHECK(a100.gpu.hbm_capacity_bytes == 80'000'000'000);
  CHECK(a100.intra_node.bandwidth_per_gpu_bytes_per_s == Approx(300e9));  // 600 GB/s bidirectional
  CHECK(a100.inter_node.nics_per_node == 8);
  CHECK(a100.inter_node.bandwidth_per_nic_bytes_per_s == Approx(25e9));  // HDR 200 Gb/s
  const megaplan::ClusterSpec h100 = megaplan::cluster_preset("dgx-h100");
  CHECK(h100.gpu.dense_bf16_flops_per_s == Approx(989.4e12));
  CHECK(h100.intra_node.bandwidth_per_gpu_bytes_per_s == Approx(450e9));
  CHECK(h100.inter_node.bandwidth_per_nic_bytes_per_s == Approx(50e9));  // NDR 400 Gb/s
  const megaplan::ClusterSpec h200 = megaplan::cluster_preset("dgx-h200");
  CHECK(h200.gpu.hbm_capacity_bytes == 141'000'000'000);
  CHECK(h200.gpu.hbm_bandwidth_bytes_per_s == Approx(4.8e12));
  CHECK(megaplan::cluster_preset("h100-x1").total_gpus() == 1);
  CHECK(megaplan::cluster_preset("h200-x1").total_gpus() == 1);
  CHECK(megaplan::cluster_preset("h200-x2").total_gpus() == 2);
  CHECK_THROWS_WITH(megaplan::cluster_preset("dgx-b200"),
                    Contains("--cluster: unknown preset \"dgx-b200\"; known presets: dgx-a100-80gb, dgx-h100"));
}

TEST_CASE("--gpus selects whole nodes or part of one node", "[cluster_spec]") {
  const megaplan::ClusterSpec dgx = megaplan::cluster_preset("dgx-a100-80gb");
  const megaplan::ClusterSpec many = megaplan::select_gpus(dgx, 1024);
  CHECK(many.num_nodes == 128);
  CHECK(many.gpus_per_node == 8);
  const megaplan::ClusterSpec few = megaplan::select_gpus(dgx, 4);
  CHECK(few.num_nodes == 1);
  CHECK(few.gpus_per_node == 4);
  CHECK_THROWS_WITH(megaplan::select_gpus(dgx, 12),
                    "--gpus: must be a multiple of a node (8 GPUs) or less than one node, got 12");
  CHECK_THROWS_WITH(megaplan::select_gpus(dgx, 0), "--gpus: must be a positive integer, got 0");
  CHECK_THROWS_WITH(megaplan::select_gpus(megaplan::cluster_preset("h200-x2"), 4),
                    "--gpus: 4 GPUs exceed cluster h200-x2 (1 nodes x 2 = 2 GPUs)");
}

TEST_CASE("cluster JSON round-trips; validation names the field", "[cluster_spec]") {
  for (const megaplan::ClusterSpec& cluster : megaplan::cluster_presets()) {
    const nlohmann::json json = megaplan::cluster_spec_to_json(cluster);
    CHECK(megaplan::cluster_spec_to_json(megaplan::cluster_spec_from_json(json, "c.json")) == json);
  }
  const megaplan::ClusterSpec file = megaplan::load_cluster_spec(kExamples + "/clusters/a100-40gb-4node.json");
  CHECK(file.total_gpus() == 32);
  CHECK(file.gpu.dense_fp16_flops_per_s == Approx(312e12));  // defaults to the bf16 peak

  nlohmann::json json = megaplan::cluster_spec_to_json(megaplan::cluster_preset("dgx-h100"));
  json["gpu"]["tflops"] = 1;
  CHECK_THROWS_WITH(megaplan::cluster_spec_from_json(json, "c.json"), "c.json: gpu: tflops: unknown field");
  json["gpu"].erase("tflops");
  json["inter_node"]["nics_per_node"] = 0;
  const megaplan::ClusterSpec no_nics = megaplan::cluster_spec_from_json(json, "c.json");
  CHECK_THROWS_WITH(megaplan::validate_cluster_spec(no_nics),
                    "inter_node.nics_per_node: must be positive when num_nodes > 1");
  json["inter_node"]["nics_per_node"] = 8;
  json["gpu"]["hbm_capacity_bytes"] = -1;
  CHECK_THROWS_WITH(megaplan::validate_cluster_spec(megaplan::cluster_spec_from_json(json, "c.json")),
                    "gpu.hbm_capacity_bytes: must be a positive integer, got -1");
  json["gpu"]["hbm_capacity_bytes"] = 80'000'000'000;
  json["num_nodes"] = int64_t{1} << 62;
  CHECK_THROWS_WITH(megaplan::validate_cluster_spec(megaplan::cluster_spec_from_json(json, "c.json")),
                    Contains("num_nodes: product") && Contains("overflows 64 bits"));
}
