// `megaplan profile`'s parts that run without a GPU: the kernel timings taken through the CPU
// backend on a tiny grid become a profile the simulator loads, whose lookups return the measured
// times at the measured points; and a bad spread is refused with the field named.
#include <catch2/catch.hpp>

#include <string>

#include "cli/profile_command.h"
#include "core/cluster_spec.h"
#include "core/error.h"
#include "executor/runtime/cpu_backend.h"
#include "executor/runtime/kernel_profiler.h"
#include "simulator/profile.h"

namespace {

megaplan::exec::ProfileGrid tiny_grid() {
  megaplan::exec::ProfileGrid grid;
  grid.gemms = {{8, 12, 16}, {16, 8, 8}};
  grid.attention = {{2, 16, 4}};
  grid.elementwise_elements = {64, 4096};
  grid.warmup = 1;
  grid.repetitions = 3;
  return grid;
}

}  // namespace

TEST_CASE("kernel timings from a backend become a profile the simulator looks up", "[cli][profile]") {
  megaplan::exec::CpuBackend backend;
  int64_t last_done = 0, last_total = 0;
  const megaplan::exec::MeasuredTables tables =
      megaplan::exec::measure_kernels(backend, tiny_grid(), [&](int64_t done, int64_t total) {
        CHECK(done == last_done + 1);
        last_done = done;
        last_total = total;
      });
  CHECK(last_done == 5);
  CHECK(last_total == 5);
  REQUIRE(tables.gemm.size() == 2);
  CHECK(tables.gemm[0].at("dtype") == "fp32");  // the CPU backend computes in fp32
  CHECK(tables.elementwise[1].at("bytes") == 3 * 4096 * 4);

  const megaplan::GpuSpec gpu = megaplan::cluster_preset("h100-x1").gpu;
  const nlohmann::json json =
      megaplan::cli::measured_profile_json(gpu, tables, "measured: test", {{"device", "the CPU backend"}});
  const megaplan::sim::Profile profile = megaplan::sim::Profile::from_json(json, "test.json");
  CHECK(profile.gpu_name() == gpu.name);
  megaplan::sim::CostSources sources;
  CHECK(profile.gemm_seconds(8, 12, 16, megaplan::sim::DType::kFp32, sources) ==
        tables.gemm[0].at("seconds").get<double>());
  CHECK(profile.attention_forward_seconds(2, 16, 4, true, sources) ==
        tables.attention[0].at("forward_s").get<double>());
  CHECK(profile.attention_backward_seconds(2, 16, 4, true, sources) ==
        tables.attention[0].at("backward_s").get<double>());
  CHECK(sources.table == 3);
  CHECK(sources.fallback == 0);
  // No bf16 entries: bf16 GEMMs take the datasheet roofline.
  (void)profile.gemm_seconds(8, 12, 16, megaplan::sim::DType::kBf16, sources);
  CHECK(sources.fallback == 1);

  nlohmann::json bad = json;
  bad["gemm"][1]["spread"] = -0.5;
  CHECK_THROWS_WITH(megaplan::sim::Profile::from_json(bad, "bad.json"),
                    Catch::Matchers::Contains("bad.json: gemm[1]: spread: must be a number >= 0"));
  bad = json;
  bad["provenance"] = "a string";
  CHECK_THROWS_WITH(megaplan::sim::Profile::from_json(bad, "bad.json"),
                    Catch::Matchers::Contains("bad.json: provenance: must be an object"));
}
