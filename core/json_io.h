// JSON reading with user-facing errors: malformed text names file, line and column; a strict
// field reader names the key whose type is wrong or that is not known.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace megaplan {

// Arrays and objects nest at most this deep in any JSON megaplan reads (its own files nest 5
// deep): deeper text is refused before parsing, so no recursion over it can exhaust the stack.
inline constexpr int kMaxJsonDepth = 64;

// Parses `text`; a syntax error becomes SpecError("SOURCE:LINE:COL", "malformed JSON: ..."), a
// number beyond a double's range or nesting deeper than kMaxJsonDepth SpecError(SOURCE..., rule).
// No exception of the JSON library escapes.
nlohmann::json parse_json_text(std::string_view text, const std::string& source);

// parse_json_text's checks without the message: nullopt for text it would refuse (for readers
// that say in their own words what the file should have been).
std::optional<nlohmann::json> try_parse_json(std::string_view text);

// Reads and parses a whole file; an unreadable file is SpecError(path, "cannot read ...").
nlohmann::json read_json_file(const std::string& path);

// The first field, in key order through nested objects, where `there` and `here` differ, as
// "PATH is X there, Y here" (values as compact JSON, cut short; a missing key "absent"), or
// nullopt when they are equal. `path` prefixes the field's name ("" at the top).
std::optional<std::string> first_json_difference(const nlohmann::json& there, const nlohmann::json& here,
                                                 const std::string& path = "");

// Reads the members of one JSON object by name with type checks, then rejects the keys nobody
// asked for (a typo in a config must not be silently ignored).
class JsonFieldReader {
 public:
  // Throws SpecError when `object` is not a JSON object.
  JsonFieldReader(const nlohmann::json& object, std::string source);

  bool has(const std::string& key) const { return object_.contains(key); }
  // Each `read` leaves `out` untouched when the key is absent (or null) and returns whether it
  // was present; `require` throws when it is absent.
  bool read(const std::string& key, int64_t& out);
  bool read(const std::string& key, uint64_t& out);
  bool read(const std::string& key, std::vector<int64_t>& out);  // an array of integers
  bool read(const std::string& key, double& out);
  bool read(const std::string& key, bool& out);
  bool read(const std::string& key, std::string& out);
  // A nested object, for a nested reader.
  const nlohmann::json* read_object(const std::string& key);
  // A nested array, its elements the caller's to check.
  const nlohmann::json* read_array(const std::string& key);
  template <typename T>
  void require(const std::string& key, T& out) {
    if (!read(key, out)) throw SpecError(field(key), "required field is missing");
  }
  // Marks keys as known without reading them (fields that are documented but ignored).
  void ignore(const std::string& key);
  // Throws SpecError naming the first key that no read/require/ignore touched, with `rule`.
  void reject_unknown_keys(const std::string& rule = "unknown field") const;

  std::string field(const std::string& key) const { return source_ + ": " + key; }

 private:
  const nlohmann::json* lookup(const std::string& key);
  const nlohmann::json& object_;
  std::string source_;
  // The members read or ignored: a reader is made for every entry of a profile's thousands, and a
  // handful of pointers costs less than a set of key strings.
  std::vector<const nlohmann::json*> used_;
};

}  // namespace megaplan
