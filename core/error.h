// SpecError: the one error type for bad user input (a spec, a plan, a file). It names the field
// that is wrong and the rule it breaks, so the CLI can print a single actionable line.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace megaplan {

class SpecError : public std::runtime_error {
 public:
  // `field` is what the user wrote or can find (a flag, a JSON key, "FILE:LINE:COL");
  // `rule` says what it must satisfy, ideally with the offending values.
  SpecError(std::string field, std::string rule)
      : std::runtime_error(field + ": " + rule), field_(std::move(field)), rule_(std::move(rule)) {}

  const std::string& field() const { return field_; }
  const std::string& rule() const { return rule_; }

 private:
  std::string field_;
  std::string rule_;
};

// `text` on one line as a terminal shows it: control characters (a newline or an escape sequence
// inside a file name or a JSON string the message quotes) written as \n, \t, \r or \xNN.
inline std::string printable_line(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string line;
  line.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte != 0x7f) {
      line += c;
    } else if (c == '\n') {
      line += "\\n";
    } else if (c == '\t') {
      line += "\\t";
    } else if (c == '\r') {
      line += "\\r";
    } else {
      line += "\\x";
      line += kHex[byte >> 4];
      line += kHex[byte & 0xf];
    }
  }
  return line;
}

}  // namespace megaplan
