// The executor's kernels timed through the Backend interface, as training calls them, into the
// measured tables of a megaplan-profile/1 file (profiles/README.md): forward GEMMs x·Wᵀ over the
// shapes a GPT layer and its tensor-parallel shards produce, causal flash attention forward and
// backward, and the residual add as the memory-bound pass. Each point runs a warm-up, then
// repetitions one after another on the backend's stream, each timed between two backend marks
// (CUDA events on the GPU); the table holds the median and the spread, (p90 - p10) / median.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include <nlohmann/json.hpp>

#include "executor/runtime/backend.h"

namespace megaplan::exec {

struct AttentionPoint {
  int64_t batch_heads, seq, head_dim;
};

struct ProfileGrid {
  std::vector<std::array<int64_t, 3>> gemms;  // m, n, k: x [m x k] times W [n x k] transposed
  std::vector<AttentionPoint> attention;       // causal
  std::vector<int64_t> elementwise_elements;   // bf16 elements per residual add
  int warmup = 2;
  int repetitions = 10;
};

// The shapes plans produce, for the GPU: tokens per microbatch 2048 to 16384 (quick: 2048 and
// 8192), widths 768 to 8192 with the qkv, projection, fc1 and fc2 GEMMs of a layer, unsharded and
// (full only) split over tp 2, 4 and 8 as column- and row-parallel layers split them; attention
// over 1024 to 8192 tokens at head dimensions 64 and 128; adds of 64 Ki to 256 Mi elements. Quick
// mode takes under a minute on an H100, full under five.
ProfileGrid profile_grid(bool quick);

struct MeasuredTables {
  nlohmann::json gemm = nlohmann::json::array();
  nlohmann::json attention = nlohmann::json::array();
  nlohmann::json elementwise = nlohmann::json::array();
};

// `progress(done, total)` after each point. Allocates each point's buffers and releases them.
MeasuredTables measure_kernels(Backend& backend, const ProfileGrid& grid,
                               const std::function<void(int64_t done, int64_t total)>& progress);

}  // namespace megaplan::exec
