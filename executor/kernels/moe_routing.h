// Megatron-Core's top-k router and token dispatch as the backends' MoE operations take them
// (Backend::moe_*; issue 40): the router's settings from core/moe_spec.h, and the two index maps a
// dispatch leaves on the device. One definition for the CPU reference and the CUDA kernels.
//
// The rows a dispatch makes are expert by expert, each expert's in token order (Megatron's
// permutation): every route where the run is dropless; with a capacity, at most that many an
// expert, dropped by the policy; padded to exactly the capacity with the earliest tokens not routed
// to the expert (rows whose output counts for nothing). An expert's rows are contiguous, so the
// experts of one expert-parallel rank are one contiguous run of rows.
#pragma once

#include <cstddef>
#include <cstdint>

namespace megaplan::exec {

struct MoeRouter {
  std::size_t experts = 0;
  std::size_t topk = 0;
  bool sigmoid = false;      // --moe-router-score-function sigmoid; else softmax
  bool pre_softmax = false;  // softmax over every expert before the choice (softmax only)
  float scaling_factor = 1;  // --moe-router-topk-scaling-factor (1: none)
};

enum class MoeDropPolicy : uint8_t { kProbs, kPosition };  // --moe-token-drop-policy

// Dropless (capacity 0), or at most `capacity` rows an expert dropped by `policy`, padded to it
// with `pad` (--moe-pad-expert-input-to-capacity).
struct MoeCapacity {
  std::size_t capacity = 0;
  MoeDropPolicy policy = MoeDropPolicy::kProbs;
  bool pad = false;
};

// Where a dispatch put each route and each row, int32 on the backend:
// - token_rows [tokens x topk]: the row of token t's route j (its j-th expert), or -1 where the
//   capacity dropped it;
// - row_tokens [rows]: the token each row holds (a pad row's too).
struct MoeDispatchMaps {
  int32_t* token_rows = nullptr;
  int32_t* row_tokens = nullptr;
};
struct ConstMoeDispatchMaps {
  const int32_t* token_rows = nullptr;
  const int32_t* row_tokens = nullptr;
};

}  // namespace megaplan::exec
