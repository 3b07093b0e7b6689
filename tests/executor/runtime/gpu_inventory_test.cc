// The GPU inventory and device probe on a real device (gpu_test_main.cc skips where none is).
#include <catch2/catch.hpp>

#include <string>

#include "core/error.h"
#include "executor/gpu_inventory.h"

namespace megaplan {
namespace {

TEST_CASE("the inventory lists at least one GPU with sane fields", "[gpu]") {
  REQUIRE(built_with_cuda());
  const GpuInventory inventory = query_gpu_inventory();
  CHECK(inventory.cuda_runtime.major >= 11);
  CHECK(inventory.cuda_driver.major >= 11);
  // A driver runs runtimes of its own major version (minor-version compatibility) and older.
  CHECK(inventory.cuda_driver.major >= inventory.cuda_runtime.major);
  CHECK(inventory.cublas.major >= 11);
  CHECK(inventory.cublaslt.major >= 11);
  CHECK(inventory.nccl.major >= 2);
  CHECK(inventory.nccl.known());

  REQUIRE_FALSE(inventory.devices.empty());
  for (size_t i = 0; i < inventory.devices.size(); ++i) {
    const GpuDevice& device = inventory.devices[i];
    INFO("device " << i << ": " << device.name);
    CHECK(device.index == static_cast<int>(i));
    CHECK_FALSE(device.name.empty());
    CHECK(device.compute_capability_major >= 7);
    CHECK(device.sm_count > 0);
    CHECK(device.total_memory_bytes > (int64_t{1} << 30));
    CHECK(device.free_memory_bytes > 0);
    CHECK(device.free_memory_bytes <= device.total_memory_bytes);
    CHECK(device.pci_bus_id.size() >= 12);  // "0000:1B:00.0"
    CHECK(device.sm_architecture() ==
          "sm_" + std::to_string(device.compute_capability_major) + std::to_string(device.compute_capability_minor));
    if (device.memory_clock_khz > 0 && device.memory_bus_width_bits > 0) {
      CHECK(device.peak_memory_bandwidth_bytes_per_s() > 1e11);  // every datacenter GPU since V100
    }
  }
}

TEST_CASE("the build records the architectures it compiled device code for", "[gpu]") {
  const std::string architectures = built_cuda_architectures();
  INFO("built for " << architectures);
  CHECK(architectures.rfind("sm_", 0) == 0);
  CHECK(architectures.find("sm_0") == std::string::npos);  // a parse that lost digits
}

TEST_CASE("probing device 0 runs a kernel and cuBLASLt on it", "[gpu]") {
  REQUIRE_NOTHROW(probe_device(0));
  // The probe leaves no error behind: a second probe (and the inventory) still work.
  REQUIRE_NOTHROW(probe_device(0));
  CHECK_FALSE(query_gpu_inventory().devices.empty());
}

TEST_CASE("every GPU of this process passes the probe", "[gpu]") {
  for (const GpuDevice& device : query_gpu_inventory().devices) {
    INFO("device " << device.index << ": " << device.name);
    CHECK_NOTHROW(probe_device(device.index));
  }
}

TEST_CASE("probing a device that does not exist names it", "[gpu]") {
  try {
    probe_device(999);
    FAIL("probe_device(999) did not throw");
  } catch (const SpecError& error) {
    CHECK(error.field() == "gpu");
    CHECK_THAT(error.rule(), Catch::Contains("device 999 does not exist"));
    CHECK_THAT(error.rule(), Catch::Contains("numbered 0 to"));
  }
  CHECK_THROWS_AS(probe_device(-1), SpecError);
}

}  // namespace
}  // namespace megaplan
