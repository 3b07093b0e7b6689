// A profile as bytes and back (profile.h's to_bytes and from_bytes): each field in turn, numbers
// as their bytes, strings and containers after their length.
#include <cstring>
#include <map>
#include <tuple>
#include <type_traits>
#include <utility>

#include "simulator/profile.h"

namespace megaplan::sim {

namespace {

class ByteWriter {
 public:
  template <typename... Fields>
  void operator()(const Fields&... fields) {
    (write(fields), ...);
  }
  std::string take() { return std::move(bytes_); }

 private:
  template <typename T>
  requires std::is_trivially_copyable_v<T>
  void write(const T& value) { bytes_.append(reinterpret_cast<const char*>(&value), sizeof value); }
  void write(const std::string& text) {
    write(text.size());
    bytes_.append(text);
  }
  template <typename T>
  void write(const std::vector<T>& values) {
    write(values.size());
    for (const T& value : values) write(value);
  }
  template <typename T, std::size_t N>
  requires(!std::is_trivially_copyable_v<T>) void write(const std::array<T, N>& values) {
    for (const T& value : values) write(value);
  }
  template <typename A, typename B>
  void write(const std::pair<A, B>& pair) {
    write(pair.first);
    write(pair.second);
  }
  template <typename... T>
  void write(const std::tuple<T...>& tuple) {
    std::apply([this](const auto&... elements) { (write(elements), ...); }, tuple);
  }
  template <typename K, typename V>
  void write(const std::map<K, V>& map) {
    write(map.size());
    for (const auto& [key, value] : map) {
      write(key);
      write(value);
    }
  }
  template <typename Curve>
  requires requires(const Curve& curve) { curve.points; }
  void write(const Curve& curve) { write(curve.points); }

  std::string bytes_;
};

class ByteReader {
 public:
  explicit ByteReader(std::string_view bytes) : bytes_(bytes) {}
  template <typename... Fields>
  void operator()(Fields&... fields) {
    (read(fields), ...);
  }

 private:
  template <typename T>
  requires std::is_trivially_copyable_v<T>
  void read(T& value) {
    std::memcpy(&value, bytes_.data(), sizeof value);
    bytes_.remove_prefix(sizeof value);
  }
  void read(std::string& text) {
    text.assign(bytes_.substr(0, read_size()));
    bytes_.remove_prefix(text.size());
  }
  template <typename T>
  void read(std::vector<T>& values) {
    values.resize(read_size());
    for (T& value : values) read(value);
  }
  template <typename T, std::size_t N>
  requires(!std::is_trivially_copyable_v<T>) void read(std::array<T, N>& values) {
    for (T& value : values) read(value);
  }
  template <typename A, typename B>
  void read(std::pair<A, B>& pair) {
    read(pair.first);
    read(pair.second);
  }
  template <typename... T>
  void read(std::tuple<T...>& tuple) {
    std::apply([this](auto&... elements) { (read(elements), ...); }, tuple);
  }
  template <typename K, typename V>
  void read(std::map<K, V>& map) {
    for (std::size_t entries = read_size(); entries > 0; --entries) {
      K key;
      read(key);
      read(map.emplace_hint(map.end(), std::move(key), V{})->second);
    }
  }
  template <typename Curve>
  requires requires(Curve& curve) { curve.points; }
  void read(Curve& curve) { read(curve.points); }
  std::size_t read_size() {
    std::size_t size = 0;
    read(size);
    return size;
  }

  std::string_view bytes_;
};

}  // namespace

// A field left out here reads back as its default, which tests/simulator/builtin_profiles_test.cc
// catches: the compiled profiles would then differ from those read from the JSON.
template <typename Profile_, typename Visit>
void Profile::visit_fields(Profile_& profile, Visit&& visit) {
  visit(profile.gpu_, profile.source_, profile.origin_, profile.transferred_from_, profile.uncertainty_,
        profile.device_, profile.curve_, profile.gemm_, profile.gemm_by_layout_, profile.attention_forward_,
        profile.attention_backward_, profile.ring_block_forward_, profile.ring_block_backward_, profile.elementwise_,
        profile.memory_kernels_, profile.collectives_, profile.p2p_, profile.compute_slowdown_,
        profile.collective_slowdown_);
}

std::string Profile::to_bytes() const {
  ByteWriter writer;
  visit_fields(*this, writer);
  return writer.take();
}

Profile Profile::from_bytes(std::string_view bytes) {
  Profile profile;
  visit_fields(profile, ByteReader(bytes));
  return profile;
}

}  // namespace megaplan::sim
