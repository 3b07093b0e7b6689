// JSON reading with errors a user can act on.
#include "core/json_io.h"

#include "core/text_file.h"

namespace megaplan {

namespace {

// nlohmann reports a byte offset (one past the offending byte); users want line and column.
std::string line_and_column(const std::string& text, std::size_t byte_offset) {
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

}  // namespace

nlohmann::json parse_json_text(const std::string& text, const std::string& source) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& error) {
    throw SpecError(source + ":" + line_and_column(text, error.byte),
                    "malformed JSON: " + parse_error_reason(error.what()));
  }
}

nlohmann::json read_json_file(const std::string& path) { return parse_json_text(read_text_file(path), path); }

JsonFieldReader::JsonFieldReader(const nlohmann::json& object, std::string source)
    : object_(object), source_(std::move(source)) {
  if (!object_.is_object()) {
    throw SpecError(source_, "must be a JSON object, got " + type_name(object_));
  }
}

const nlohmann::json* JsonFieldReader::lookup(const std::string& key) {
  used_.insert(key);
  const auto found = object_.find(key);
  if (found == object_.end() || found->is_null()) return nullptr;
  return &*found;
}

bool JsonFieldReader::read(const std::string& key, int64_t& out) {
  const nlohmann::json* value = lookup(key);
  if (value == nullptr) return false;
  if (!value->is_number_integer()) {
    throw SpecError(field(key), "must be an integer, got " + type_name(*value) + " " + value->dump());
  }
  if (value->is_number_unsigned() && value->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    throw SpecError(field(key), "value " + value->dump() + " overflows 64 bits");
  }
  out = value->get<int64_t>();
  return true;
}

bool JsonFieldReader::read(const std::string& key, double& out) {
  const nlohmann::json* value = lookup(key);
  if (value == nullptr) return false;
  if (!value->is_number()) {
    throw SpecError(field(key), "must be a number, got " + type_name(*value) + " " + value->dump());
  }
  out = value->get<double>();
  return true;
}

bool JsonFieldReader::read(const std::string& key, bool& out) {
  const nlohmann::json* value = lookup(key);
  if (value == nullptr) return false;
  if (!value->is_boolean()) {
    throw SpecError(field(key), "must be true or false, got " + type_name(*value) + " " + value->dump());
  }
  out = value->get<bool>();
  return true;
}

bool JsonFieldReader::read(const std::string& key, std::string& out) {
  const nlohmann::json* value = lookup(key);
  if (value == nullptr) return false;
  if (!value->is_string()) {
    throw SpecError(field(key), "must be a string, got " + type_name(*value) + " " + value->dump());
  }
  out = value->get<std::string>();
  return true;
}

const nlohmann::json* JsonFieldReader::read_object(const std::string& key) {
  const nlohmann::json* value = lookup(key);
  if (value != nullptr && !value->is_object()) {
    throw SpecError(field(key), "must be a JSON object, got " + type_name(*value));
  }
  return value;
}

void JsonFieldReader::reject_unknown_keys() const {
  for (const auto& [key, value] : object_.items()) {
    if (used_.count(key) == 0) {
      throw SpecError(field(key), "unknown field");
    }
  }
}

}  // namespace megaplan
