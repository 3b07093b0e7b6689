// A profile of round numbers for the simulator's tests: 1 PFLOP/s, 1 us launches, efficiencies of
// one half and one quarter, the given GPU and memory bandwidth, no measured tables.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace megaplan::test {

inline nlohmann::json round_profile(const std::string& gpu, double memory_bandwidth_bytes_per_s) {
  return {{"schema", "megaplan-profile/1"},
          {"gpu", gpu},
          {"source", "test"},
          {"device",
           {{"peak_bf16_flops_per_s", 1e15},
            {"memory_bandwidth_bytes_per_s", memory_bandwidth_bytes_per_s},
            {"kernel_launch_s", 1e-6}}},
          {"roofline",
           {{"gemm_max_efficiency", 0.5},
            {"gemm_half_efficiency_flops", 1e9},
            {"attention_max_efficiency", 0.25},
            {"attention_half_efficiency_flops", 1e9},
            {"memory_efficiency", 0.5},
            {"link_efficiency", 0.5}}}};
}

}  // namespace megaplan::test
