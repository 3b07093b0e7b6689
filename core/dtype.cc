#include "core/dtype.h"

#include <cstring>
#include <stdexcept>

namespace megaplan {

std::size_t dtype_bytes(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
    case DType::kFloat16: return 2;
    case DType::kFloat32: return 4;
  }
  throw std::invalid_argument("dtype_bytes: unknown DType " + std::to_string(static_cast<int>(dtype)));
}

std::string to_string(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16: return "bf16";
    case DType::kFloat16: return "fp16";
    case DType::kFloat32: return "fp32";
  }
  return "unknown DType";
}

float bf16_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

uint16_t float_to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  // A NaN whose payload sits only in the low half would round to infinity (or carry into the
  // exponent): keep it a NaN by setting the quiet bit instead of rounding.
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x40u);
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(bits >> 16);
}

// The compiler's half type converts with IEEE rounding (in software where the CPU lacks it):
// _Float16 in GCC and Clang from 15; Clang 14 (the fuzz build's) has only the storage type __fp16,
// whose conversions come from compiler-rt's builtins (the fuzz build links them).
#if defined(__clang__) && __clang_major__ < 15
using HostHalf = __fp16;
#else
using HostHalf = _Float16;
#endif

float fp16_to_float(uint16_t bits) {
  HostHalf half;
  std::memcpy(&half, &bits, sizeof half);
  return static_cast<float>(half);
}

uint16_t float_to_fp16(float value) {
  const HostHalf half = static_cast<HostHalf>(value);
  uint16_t bits;
  std::memcpy(&bits, &half, sizeof bits);
  return bits;
}

float half_to_float(uint16_t bits, DType dtype) {
  return dtype == DType::kFloat16 ? fp16_to_float(bits) : bf16_to_float(bits);
}

uint16_t float_to_half(float value, DType dtype) {
  return dtype == DType::kFloat16 ? float_to_fp16(value) : float_to_bf16(value);
}

}  // namespace megaplan
