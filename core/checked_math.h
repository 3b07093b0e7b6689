// Overflow-checked 64-bit integer arithmetic for sizes that users multiply together (world sizes,
// batch sizes, parameter counts). An overflow is a SpecError naming the field, never UB.
// Fields are string_views and messages are built only on failure: the planner checks ~10^5 plans.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "core/error.h"

namespace megaplan {

inline int64_t checked_multiply(int64_t a, int64_t b, std::string_view field) {
  int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) {
    throw SpecError(std::string(field),
                    "product " + std::to_string(a) + " x " + std::to_string(b) + " overflows 64 bits");
  }
  return product;
}

inline int64_t checked_add(int64_t a, int64_t b, std::string_view field) {
  int64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) {
    throw SpecError(std::string(field), "sum " + std::to_string(a) + " + " + std::to_string(b) + " overflows 64 bits");
  }
  return sum;
}

// REQUIRES: value > 0 and multiple > 0.
inline int64_t round_up_to_multiple(int64_t value, int64_t multiple, std::string_view field) {
  const int64_t blocks = value / multiple + (value % multiple != 0 ? 1 : 0);
  return checked_multiply(blocks, multiple, field);
}

inline void require_positive(int64_t value, std::string_view field) {
  if (value <= 0) {
    throw SpecError(std::string(field), "must be a positive integer, got " + std::to_string(value));
  }
}

// Throws SpecError(field, "<what> (value % divisor = r)") unless divisor divides value. `what` is a
// string or a callable returning one (called only on failure). REQUIRES: divisor > 0.
template <typename What>
void require_divides(int64_t divisor, int64_t value, std::string_view field, What&& what) {
  if (value % divisor == 0) return;
  std::string message;
  if constexpr (std::is_invocable_v<What>) {
    message = what();
  } else {
    message = std::string(what);
  }
  throw SpecError(std::string(field), message + " (" + std::to_string(value) + " % " + std::to_string(divisor) + " = " +
                                          std::to_string(value % divisor) + ")");
}

}  // namespace megaplan
