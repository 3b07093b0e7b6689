// Overflow-checked 64-bit integer arithmetic for sizes that users multiply together (world sizes,
// batch sizes, parameter counts). An overflow is a SpecError naming the field, never UB.
#pragma once

#include <cstdint>
#include <string>

#include "core/error.h"

namespace megaplan {

inline int64_t checked_multiply(int64_t a, int64_t b, const std::string& field) {
  int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) {
    throw SpecError(field, "product " + std::to_string(a) + " x " + std::to_string(b) +
                               " overflows 64 bits");
  }
  return product;
}

inline int64_t checked_add(int64_t a, int64_t b, const std::string& field) {
  int64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) {
    throw SpecError(field, "sum " + std::to_string(a) + " + " + std::to_string(b) +
                               " overflows 64 bits");
  }
  return sum;
}

// REQUIRES: value > 0 and multiple > 0.
inline int64_t round_up_to_multiple(int64_t value, int64_t multiple, const std::string& field) {
  const int64_t blocks = value / multiple + (value % multiple != 0 ? 1 : 0);
  return checked_multiply(blocks, multiple, field);
}

inline void require_positive(int64_t value, const std::string& field) {
  if (value <= 0) {
    throw SpecError(field, "must be a positive integer, got " + std::to_string(value));
  }
}

// Throws SpecError(field, "<what> (value % divisor = r)") unless divisor divides value.
// REQUIRES: divisor > 0.
inline void require_divides(int64_t divisor, int64_t value, const std::string& field, const std::string& what) {
  if (value % divisor != 0) {
    throw SpecError(field, what + " (" + std::to_string(value) + " % " + std::to_string(divisor) + " = " +
                               std::to_string(value % divisor) + ")");
  }
}

}  // namespace megaplan
