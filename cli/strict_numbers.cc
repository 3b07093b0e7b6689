#include "cli/strict_numbers.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace megaplan::cli {

namespace {

// "" when `text` is a decimal integer that fits T, else why not; rewrites it as the digits CLI11
// reads in base 10 (argparse's int() reads "010" as 10, where CLI11 would read octal 8).
template <typename T>
std::string decimal_integer_error(std::string& text) {
  const char* begin = text.data();
  const char* end = begin + text.size();
  if (begin != end && *begin == '+') ++begin;  // argparse's int() takes a plus sign
  const bool negative = begin != end && *begin == '-';
  const std::string digits(begin + (negative ? 1 : 0), end);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) {
    return "must be a decimal integer, got \"" + text + "\"";
  }
  T value{};
  const auto [at, error] = std::from_chars(begin, end, value);
  if (error == std::errc::result_out_of_range) return "out of range: " + text + " does not fit in 64 bits";
  if (error != std::errc() || at != end) return "must be a decimal integer, got \"" + text + "\"";
  text = std::to_string(value);
  return "";
}

std::string finite_number_error(std::string& text) {
  try {
    std::size_t used = 0;
    const double value = std::stod(text, &used);
    if (used != text.size()) return "must be a number, got \"" + text + "\"";
    if (!std::isfinite(value)) return "must be a finite number, got " + text;
  } catch (const std::out_of_range&) {
    return "out of range: " + text + " is beyond a double's range";
  } catch (const std::invalid_argument&) {
    return "must be a number, got \"" + text + "\"";
  }
  return "";
}

}  // namespace

void require_strict_numbers(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    const std::string type = option->get_type_name();
    if (type == "INT") {
      option->transform(CLI::Validator(decimal_integer_error<int64_t>, "", "decimal integer"));
    } else if (type == "UINT") {
      option->transform(CLI::Validator(decimal_integer_error<uint64_t>, "", "decimal integer"));
    } else if (type == "FLOAT") {
      option->check(CLI::Validator(finite_number_error, "", "finite number"));
    }
  }
  for (CLI::App* subcommand : app.get_subcommands({})) require_strict_numbers(*subcommand);
}

}  // namespace megaplan::cli
