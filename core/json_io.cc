// JSON reading with errors a user can act on.
#include "core/json_io.h"

#include <algorithm>

#include "core/text_file.h"

namespace megaplan {

namespace {

// nlohmann reports a byte offset (one past the offending byte); users want line and column.
std::string line_and_column(std::string_view text, std::size_t byte_offset) {
  std::size_t line = 1;
  std::size_t column = 1;
  const std::size_t end = byte_offset == 0 ? 0 : std::min(byte_offset - 1, text.size());
  for (std::size_t i = 0; i < end; ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return std::to_string(line) + ":" + std::to_string(column);
}

// "[json.exception.parse_error.101] parse error at line 1, column 5: syntax error ..." keeps
// only what follows the position, which is the useful part.
std::string parse_error_reason(const std::string& what) {
  const std::size_t colon = what.find(": ");
  return colon == std::string::npos ? what : what.substr(colon + 2);
}

std::string type_name(const nlohmann::json& value) { return value.type_name(); }

// A value as an error message shows it: JSON (control characters escaped), at most 40 characters.
std::string shown(const nlohmann::json& value) {
  constexpr std::size_t kLongest = 40;
  const std::string text = value.dump(-1, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
  return text.size() <= kLongest ? text : text.substr(0, kLongest) + "...";
}

// The byte offset (one past it, as nlohmann counts) of the bracket that nests deeper than
// kMaxJsonDepth, or 0. Brackets inside strings do not count.
std::size_t too_deep_at(std::string_view text) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, a quote included
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return i + 1;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return 0;
}

}  // namespace

nlohmann::json parse_json_text(std::string_view text, const std::string& source) {
  if (const std::size_t at = too_deep_at(text)) {
    throw SpecError(source + ":" + line_and_column(text, at),
                    "malformed JSON: arrays and objects nest deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& error) {
    throw SpecError(source + ":" + line_and_column(text, error.byte),
                    "malformed JSON: " + parse_error_reason(error.what()));
  } catch (const nlohmann::json::out_of_range& error) {
    // 406: a number beyond a double's range ("number overflow parsing '1e999'"); the library does
    // not say where, the number says what.
    const std::string what = error.what();
    const std::size_t quote = what.find('\'');
    const std::string number = quote == std::string::npos ? "" : " " + what.substr(quote);
    throw SpecError(source, "malformed JSON: the number" + number + " is beyond a double's range (1.8e308)");
  } catch (const nlohmann::json::exception& error) {
    throw SpecError(source, "malformed JSON: " + parse_error_reason(error.what()));
  }
}

std::optional<nlohmann::json> try_parse_json(std::string_view text) {
  if (too_deep_at(text) != 0) return std::nullopt;
  nlohmann::json value = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return std::nullopt;
  return value;
}

nlohmann::json read_json_file(const std::string& path) { return parse_json_text(read_text_file(path), path); }

JsonFieldReader::JsonFieldReader(const nlohmann::json& object, std::string source)
    : object_(object), source_(std::move(source)) {
  if (!object_.is_object()) {
    throw SpecError(source_, "must be a JSON object, got " + type_name(object_));
  }
}

void JsonFieldReader::ignore(const std::string& key) {
  if (const auto found = object_.find(key); found != object_.end()) used_.push_back(&*found);
}

const nlohmann::json* JsonFieldReader::lookup(const std::string& key) {
  const auto found = object_.find(key);
  if (found == object_.end()) return nullptr;
  used_.push_back(&*found);
  return found->is_null() ? nullptr : &*found;
}

bool JsonFieldReader::read(const std::string& key, int64_t& out) {
  const nlohmann::json* value = lookup(key);
  if (value == nullptr) return false;
  if (!value->is_number_integer()) {
    throw SpecError(field(key), "must be an integer, got " + type_name(*value) + " " + shown(*value));
  }
  if (value->is_number_unsigned() && value->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    throw SpecError(field(key), "value " + shown(*value) + " overflows 64 bits");
  }
  out = value->get<int64_t>();
  return true;
}

bool JsonFieldReader::read(const std::string& key, uint64_t& out) {
  const nlohmann::json* value = lookup(key);
  if (value == nullptr) return false;
  if (!value->is_number_unsigned()) {
    throw SpecError(field(key), "must be a non-negative integer, got " + type_name(*value) + " " + shown(*value));
  }
  out = value->get<uint64_t>();
  return true;
}

bool JsonFieldReader::read(const std::string& key, std::vector<int64_t>& out) {
  const nlohmann::json* value = lookup(key);
  if (value == nullptr) return false;
  if (!value->is_array()) throw SpecError(field(key), "must be an array of integers, got " + type_name(*value));
  std::vector<int64_t> values;
  for (const nlohmann::json& element : *value) {
    const bool fits = element.is_number_integer() &&
                      !(element.is_number_unsigned() && element.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX));
    if (!fits) {
      throw SpecError(field(key),
                      "must be an array of 64-bit integers, and holds " + type_name(element) + " " + shown(element));
    }
    values.push_back(element.get<int64_t>());
  }
  out = std::move(values);
  return true;
}

bool JsonFieldReader::read(const std::string& key, double& out) {
  const nlohmann::json* value = lookup(key);
  if (value == nullptr) return false;
  if (!value->is_number()) {
    throw SpecError(field(key), "must be a number, got " + type_name(*value) + " " + shown(*value));
  }
  out = value->get<double>();
  return true;
}

bool JsonFieldReader::read(const std::string& key, bool& out) {
  const nlohmann::json* value = lookup(key);
  if (value == nullptr) return false;
  if (!value->is_boolean()) {
    throw SpecError(field(key), "must be true or false, got " + type_name(*value) + " " + shown(*value));
  }
  out = value->get<bool>();
  return true;
}

bool JsonFieldReader::read(const std::string& key, std::string& out) {
  const nlohmann::json* value = lookup(key);
  if (value == nullptr) return false;
  if (!value->is_string()) {
    throw SpecError(field(key), "must be a string, got " + type_name(*value) + " " + shown(*value));
  }
  out = value->get<std::string>();
  return true;
}

const nlohmann::json* JsonFieldReader::read_array(const std::string& key) {
  const nlohmann::json* value = lookup(key);
  if (value != nullptr && !value->is_array()) {
    throw SpecError(field(key), "must be a JSON array, got " + type_name(*value));
  }
  return value;
}

const nlohmann::json* JsonFieldReader::read_object(const std::string& key) {
  const nlohmann::json* value = lookup(key);
  if (value != nullptr && !value->is_object()) {
    throw SpecError(field(key), "must be a JSON object, got " + type_name(*value));
  }
  return value;
}

void JsonFieldReader::reject_unknown_keys(const std::string& rule) const {
  for (auto member = object_.begin(); member != object_.end(); ++member) {
    if (std::find(used_.begin(), used_.end(), &member.value()) == used_.end()) {
      throw SpecError(field(member.key()), rule);
    }
  }
}

namespace {

// A value as an error line quotes it: compact JSON, cut short.
std::string quoted_value(const nlohmann::json& value) {
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return text.size() > 60 ? text.substr(0, 57) + "..." : text;
}

}  // namespace

std::optional<std::string> first_json_difference(const nlohmann::json& there, const nlohmann::json& here,
                                                 const std::string& path) {
  if (there.is_object() && here.is_object()) {
    nlohmann::json keys = nlohmann::json::object();  // the union, sorted
    for (const auto& [key, value] : there.items()) keys[key] = true;
    for (const auto& [key, value] : here.items()) keys[key] = true;
    for (const auto& [key, unused] : keys.items()) {
      const std::string field = path.empty() ? key : path + "." + key;
      if (!there.contains(key)) return field + " is absent there, " + quoted_value(here.at(key)) + " here";
      if (!here.contains(key)) return field + " is " + quoted_value(there.at(key)) + " there, absent here";
      if (std::optional<std::string> found = first_json_difference(there.at(key), here.at(key), field)) return found;
    }
    return std::nullopt;
  }
  if (there == here) return std::nullopt;
  return path + " is " + quoted_value(there) + " there, " + quoted_value(here) + " here";
}

}  // namespace megaplan
