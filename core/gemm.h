// A linear layer's GEMM as every library names it: which of its three training products runs,
// and what the GEMM does besides the product. One vocabulary for core's kernel lists, the
// simulator's profile tables, and the executor's backends and kernels.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace megaplan {

// Which product of a linear layer y[m x n] = x[m x k] W^T (W stored [n x k]) runs: the forward,
// the input gradient dx[m x k] = dy W, or the weight gradient dW[n x k] = dy^T x. 2mnk FLOPs each.
enum class GemmLayout : uint8_t { kForward, kInputGradient, kWeightGradient };
inline constexpr std::array<GemmLayout, 3> kGemmLayouts = {GemmLayout::kForward, GemmLayout::kInputGradient,
                                                           GemmLayout::kWeightGradient};

// What the GEMM does besides the product (cuBLASLt epilogues): add a bias; add it and apply GELU
// (keeping the pre-activation); multiply the input gradient by GELU' of the kept pre-activation;
// sum the output gradient's columns into the bias gradient.
enum class GemmEpilogue : uint8_t { kNone, kBias, kBiasGelu, kGeluGradient, kBiasGradient };
inline constexpr std::array<GemmEpilogue, 5> kGemmEpilogues = {GemmEpilogue::kNone, GemmEpilogue::kBias,
                                                               GemmEpilogue::kBiasGelu, GemmEpilogue::kGeluGradient,
                                                               GemmEpilogue::kBiasGradient};
// The epilogues of a forward product (none, bias, bias-GELU); the other two belong to the backward.
constexpr bool is_forward_epilogue(GemmEpilogue epilogue) {
  return epilogue == GemmEpilogue::kNone || epilogue == GemmEpilogue::kBias || epilogue == GemmEpilogue::kBiasGelu;
}
std::string to_string(GemmLayout layout);      // "forward", "input_gradient", "weight_gradient"
std::string to_string(GemmEpilogue epilogue);  // "none", "bias", "bias_gelu", "gelu_gradient", "bias_gradient"

}  // namespace megaplan
