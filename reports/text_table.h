// TextTable: aligned plain-text tables for terminal output (numbers right-aligned, text left).
#pragma once

#include <string>
#include <vector>

namespace megaplan {

class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header);

  // REQUIRES: row.size() == header size.
  void add_row(std::vector<std::string> row);
  // Columns separated by two spaces; a cell that parses as a number is right-aligned.
  std::string render() const;

 private:
  std::vector<std::vector<std::string>> rows_;  // rows_[0] is the header
};

// Human-readable quantities: 174.56e9 -> "174.6B"; 2.5e18 FLOPs -> "2.50 EFLOP";
// 85899345920 bytes -> "80.0 GiB".
std::string format_count(double value);
std::string format_flops(double flops);
std::string format_bytes(double bytes);
// Memory, always in GiB with two decimals, so that columns and reports compare: "80.00 GiB";
// gib_number: the number alone, for a column headed in GiB.
std::string format_gib(double bytes);
std::string gib_number(double bytes);
// A fraction as a percentage with one decimal: 0.1234 -> "12.3%"; `with_sign`: "+12.3%", "-4.0%".
std::string format_percent(double fraction, bool with_sign = false);

}  // namespace megaplan
