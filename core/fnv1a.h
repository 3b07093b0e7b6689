// FNV-1a, 64 bits: a hash that is the same on every platform and standard library (std::hash is
// not), for checkpoint checksums, parameter seeds and hash-table keys.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace megaplan {

class Fnv1a64 {
 public:
  static constexpr uint64_t kOffsetBasis = 14695981039346656037ull;
  static constexpr uint64_t kPrime = 1099511628211ull;

  constexpr explicit Fnv1a64(uint64_t basis = kOffsetBasis) : hash_(basis) {}

  Fnv1a64& add(const void* data, std::size_t size) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < size; ++i) hash_ = (hash_ ^ bytes[i]) * kPrime;
    return *this;
  }
  Fnv1a64& add(std::string_view text) { return add(text.data(), text.size()); }
  // One step per 64-bit word rather than per byte: for hash-table keys made of integers.
  constexpr Fnv1a64& add_word(uint64_t word) {
    hash_ = (hash_ ^ word) * kPrime;
    return *this;
  }
  constexpr uint64_t value() const { return hash_; }

 private:
  uint64_t hash_;
};

}  // namespace megaplan
