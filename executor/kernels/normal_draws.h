// Initial weights drawn from a counter-based generator (Philox4x32-10, from Random123), one
// definition for the CPU backend and the CUDA kernel. An element's value depends only on the run's
// seed, the tensor and the element's index in the whole (single-rank) tensor, so each rank draws
// just its own part, on its own device, and every layout and backend starts from the single rank's
// values bit for bit.
//
// The transform to normals is Box–Muller in double, on a log and a sine and cosine built here from
// +, -, x, / and sqrt alone (IEEE 754 rounds each exactly, on the host and in CUDA), with no
// multiply fused into an add (exact_product), rounded to float at the end. Not the library's
// log/sin/cos: glibc's and CUDA's differ in the last ulp, and one ulp in a double moves the float
// now and then. Not cuRAND either: its device API runs only on the device, and its host generator
// is a library of its own, so the CPU backend could not draw the kernel's numbers.
#pragma once

#include <Random123/philox.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "executor/host_device.h"
#include "executor/model/tensor_shards.h"

namespace megaplan::exec {

// a x b rounded once and never fused into an FMA with an add or subtraction that reads it, which
// would round once for both and so differ between compilers and targets. nvcc contracts by default
// (--fmad=true), and so does GCC for C++ wherever the target has FMA (-ffp-contract=fast is its
// default outside ISO C; #pragma STDC FP_CONTRACT is ignored): __dmul_rn on the device, and on the
// host an empty asm statement that takes the product through a register (memory on targets other
// than x86-64 and AArch64), after which no add can fuse with the multiply.
MEGAPLAN_HOST_DEVICE inline double exact_product(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(a, b);
#else
  double product = a * b;
#if defined(__x86_64__)
  asm("" : "+x"(product));
#elif defined(__aarch64__)
  asm("" : "+w"(product));
#else
  asm("" : "+m"(product));
#endif
  return product;
#endif
}

// a / b and sqrt(a), correctly rounded as IEEE 754 requires on both sides; the device's intrinsics
// say so whatever nvcc's flags.
MEGAPLAN_HOST_DEVICE inline double exact_quotient(double a, double b) {
#ifdef __CUDA_ARCH__
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

MEGAPLAN_HOST_DEVICE inline double exact_sqrt(double a) {
#ifdef __CUDA_ARCH__
  return __dsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// ln(u) for 0 < u <= 1, within a few ulps. u = 2^e m with m in [sqrt(1/2), sqrt(2)] (exponent
// split on the bits), ln u = e ln 2 + 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.172; the series
// of atanh to s^21 leaves < 1e-18 of ln m. ln 2 in two parts (Cody and Waite): e x its high part
// is exact.
MEGAPLAN_HOST_DEVICE inline double portable_log(double u) {
  uint64_t bits;
  std::memcpy(&bits, &u, sizeof bits);
  auto exponent = static_cast<int64_t>(bits >> 52) - 1023;
  bits = (bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull;
  double m;
  std::memcpy(&m, &bits, sizeof m);  // [1, 2)
  if (m > 0x1.6a09e667f3bcdp+0) {    // sqrt(2)
    m = exact_product(m, 0.5);
    exponent += 1;
  }
  const double s = exact_quotient(m - 1.0, m + 1.0);  // m - 1 is exact (Sterbenz)
  const double s2 = exact_product(s, s);
  // 1 / (2k + 1), k = 10 .. 0.
  constexpr double kInverseOdd[] = {0x1.8618618618618p-5, 0x1.af286bca1af28p-5, 0x1.e1e1e1e1e1e1ep-5,
                                    0x1.1111111111111p-4, 0x1.3b13b13b13b14p-4, 0x1.745d1745d1746p-4,
                                    0x1.c71c71c71c71cp-4, 0x1.2492492492492p-3, 0x1.999999999999ap-3,
                                    0x1.5555555555555p-2, 0x1.0000000000000p+0};
  double series = kInverseOdd[0];
  for (int k = 1; k < 11; ++k) series = exact_product(series, s2) + kInverseOdd[k];
  const double log_m = exact_product(2.0 * s, series);
  const auto e = static_cast<double>(exponent);
  return exact_product(e, 0x1.62e42fee00000p-1) + (exact_product(e, 0x1.a39ef35793c76p-33) + log_m);
}

struct SinCos {
  double sin, cos;
};

// sin and cos of 2 pi v for v = turn / 2^53 (turn < 2^53), within a few ulps. The turn is cut
// exactly into quarter turns q and a rest f in [-1/2, 1/2] of one (integer arithmetic), the rest's
// angle t = f pi / 2 (|t| <= pi / 4) goes into Taylor series to t^17 and t^16 (< 1e-18 left
// out), and the quarter turns rotate the pair.
MEGAPLAN_HOST_DEVICE inline SinCos portable_sin_cos(uint64_t turn) {
  constexpr uint64_t kQuarter = uint64_t{1} << 51;
  const uint64_t quarters = (turn + kQuarter / 2) / kQuarter;  // nearest, 0 .. 4
  const auto rest = static_cast<double>(static_cast<int64_t>(turn) - static_cast<int64_t>(quarters * kQuarter));
  const double t = exact_product(rest, 0x1.921fb54442d18p-51);  // rest / 2^51 of a quarter turn, in radians
  const double t2 = exact_product(t, t);
  // (-1)^k / (2k + 1)! and (-1)^k / (2k)!, k = 8 .. 0.
  constexpr double kSine[] = {0x1.952c77030ad4ap-49,  -0x1.ae7f3e733b81fp-41, 0x1.6124613a86d09p-33,
                              -0x1.ae64567f544e4p-26, 0x1.71de3a556c734p-19,  -0x1.a01a01a01a01ap-13,
                              0x1.1111111111111p-7,   -0x1.5555555555555p-3,  0x1.0000000000000p+0};
  constexpr double kCosine[] = {0x1.ae7f3e733b81fp-45,  -0x1.93974a8c07c9dp-37, 0x1.1eed8eff8d898p-29,
                                -0x1.27e4fb7789f5cp-22, 0x1.a01a01a01a01ap-16,  -0x1.6c16c16c16c17p-10,
                                0x1.5555555555555p-5,   -0x1.0000000000000p-1,  0x1.0000000000000p+0};
  double sine = kSine[0], cosine = kCosine[0];
  for (int k = 1; k < 9; ++k) {
    sine = exact_product(sine, t2) + kSine[k];
    cosine = exact_product(cosine, t2) + kCosine[k];
  }
  sine = exact_product(sine, t);
  switch (quarters & 3) {
    case 0: return {sine, cosine};
    case 1: return {cosine, -sine};
    case 2: return {-sine, -cosine};
    default: return {-cosine, sine};
  }
}

// Elements 2j and 2j + 1 of a tensor, as standard normals.
struct StandardPair {
  double even, odd;
};

// One tensor's normal(0, sigma) values, and where this rank's part of it lies in the whole.
struct NormalDraws {
  uint64_t seed = 0;    // --seed
  uint64_t tensor = 0;  // the tensor's key (StageChunk: a hash of its name)
  double sigma = 1;     // the standard deviation
  PartPlacement part;   // this rank's elements in the whole tensor

  // Whole-tensor elements 2j and 2j + 1 as doubles of the standard normal: one Philox draw keyed by
  // the seed, counter (j, tensor), gives two 53-bit uniforms, u in (0, 1] (never 0, for the log)
  // and v in [0, 1); Box–Muller's sqrt(-2 ln u) (cos, sin) of 2 pi v.
  MEGAPLAN_HOST_DEVICE StandardPair standard_pair(uint64_t j) const {
    const r123::Philox4x32::ctr_type counter = {{static_cast<uint32_t>(j), static_cast<uint32_t>(j >> 32),
                                                 static_cast<uint32_t>(tensor), static_cast<uint32_t>(tensor >> 32)}};
    const r123::Philox4x32::key_type key = {{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}};
    const r123::Philox4x32::ctr_type words = r123::Philox4x32()(counter, key);
    const uint64_t first = (words.v[0] | static_cast<uint64_t>(words.v[1]) << 32) >> 11;
    const uint64_t second = (words.v[2] | static_cast<uint64_t>(words.v[3]) << 32) >> 11;
    const double u = exact_product(static_cast<double>(first + 1), 0x1p-53);  // exact
    const double radius = exact_sqrt(-2.0 * portable_log(u));
    const SinCos angle = portable_sin_cos(second);
    return {exact_product(radius, angle.cos), exact_product(radius, angle.sin)};
  }
  MEGAPLAN_HOST_DEVICE float scaled(double standard) const {
#ifdef __CUDA_ARCH__
    return __double2float_rn(exact_product(sigma, standard));
#else
    return static_cast<float>(exact_product(sigma, standard));  // to nearest, as IEEE 754's default mode
#endif
  }
  // Element `element` of the whole tensor.
  MEGAPLAN_HOST_DEVICE float whole_value(uint64_t element) const {
    const StandardPair pair = standard_pair(element >> 1);
    return scaled(element & 1 ? pair.odd : pair.even);
  }
  // Elements 2i and 2i + 1 of this rank's part of n elements (the second where 2i + 1 < n) into
  // values[2i] and values[2i + 1]: the work of one CUDA thread, and of the CPU's loop over i. Two
  // elements that are neighbours of one pair in the whole (all but at a run's odd ends) share its
  // draw.
  MEGAPLAN_HOST_DEVICE void draw_two(uint64_t i, uint64_t n, float* values) const {
    const uint64_t first = 2 * i, whole_first = part.whole_index(first);
    const StandardPair pair = standard_pair(whole_first >> 1);
    values[first] = scaled(whole_first & 1 ? pair.odd : pair.even);
    if (first + 1 >= n) return;
    const uint64_t whole_second = part.whole_index(first + 1);
    const bool same_pair = !(whole_first & 1) && whole_second == whole_first + 1;
    values[first + 1] = same_pair ? scaled(pair.odd) : whole_value(whole_second);
  }
};

}  // namespace megaplan::exec
