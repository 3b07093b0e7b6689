// An element type: what a tensor's elements are, one enum for whoever asks — the training's
// precision (bf16, or fp16 under Megatron's loss scaler), a profile's GEMM entries, a
// communicator's buffers, a kernel's template argument — and the host's conversions between the
// 16-bit types and fp32, which the CPU implementations reduce with, checkpoints read and write,
// and tests compute expected values with.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace megaplan {

enum class DType : uint8_t { kBFloat16, kFloat16, kFloat32 };
inline constexpr std::array<DType, 3> kDTypes = {DType::kBFloat16, DType::kFloat16, DType::kFloat32};
// The 16-bit types a run's activations and compute weights may take (--bf16, --fp16).
inline constexpr std::array<DType, 2> kTrainingPrecisions = {DType::kBFloat16, DType::kFloat16};

std::size_t dtype_bytes(DType dtype);  // 2, 2, 4
std::string to_string(DType dtype);    // "bf16", "fp16", "fp32"

// kBFloat16 elements are stored as uint16_t bits (the upper half of an fp32), kFloat16 as IEEE
// half-precision bits. Widening is exact; narrowing rounds to nearest even and keeps a NaN a quiet
// NaN (as the CUDA kernels' conversions do); fp16 overflows to infinity past 65504, as the
// device's does.
float bf16_to_float(uint16_t bits);
uint16_t float_to_bf16(float value);
float fp16_to_float(uint16_t bits);
uint16_t float_to_fp16(float value);
// A 16-bit element of `dtype` (kBFloat16 or kFloat16) to and from fp32, by the two pairs above.
float half_to_float(uint16_t bits, DType dtype);
uint16_t float_to_half(float value, DType dtype);

}  // namespace megaplan
