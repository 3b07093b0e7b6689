// Plain-text tables and unit formatting.
#include "reports/text_table.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace megaplan {

namespace {

bool looks_numeric(const std::string& cell) {
  if (cell.empty()) return false;
  const unsigned char first = static_cast<unsigned char>(cell[0]);
  return std::isdigit(first) || ((cell[0] == '-' || cell[0] == '.') && cell.size() > 1);
}

std::string printf_string(const char* format, double value, const char* unit) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, format, value, unit);
  return buffer;
}

// Scales `value` by powers of `base` until it is below `base`, then prints it with a suffix.
std::string scaled(double value, double base, const std::vector<const char*>& suffixes, const char* format) {
  std::size_t index = 0;
  while (std::abs(value) >= base && index + 1 < suffixes.size()) {
    value /= base;
    ++index;
  }
  return printf_string(format, value, suffixes[index]);
}

}  // namespace

TextTable::TextTable(std::vector<std::string> header) { rows_.push_back(std::move(header)); }

void TextTable::add_row(std::vector<std::string> row) {
  if (row.size() != rows_.front().size()) throw std::logic_error("TextTable: row width differs from header");
  rows_.push_back(std::move(row));
}

std::string TextTable::render() const {
  std::vector<std::size_t> widths(rows_.front().size(), 0);
  for (const auto& row : rows_) {
    for (std::size_t column = 0; column < row.size(); ++column) widths[column] = std::max(widths[column], row[column].size());
  }
  std::string out;
  for (const auto& row : rows_) {
    std::string line;
    for (std::size_t column = 0; column < row.size(); ++column) {
      const std::string padding(widths[column] - row[column].size(), ' ');
      if (column > 0) line += "  ";
      line += looks_numeric(row[column]) ? padding + row[column] : row[column] + padding;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

std::string format_count(double value) {
  return scaled(value, 1000.0, {"", "K", "M", "B", "T", "Q"}, "%.1f%s");
}

std::string format_flops(double flops) {
  return scaled(flops, 1000.0, {" FLOP", " KFLOP", " MFLOP", " GFLOP", " TFLOP", " PFLOP", " EFLOP", " ZFLOP"},
                "%.2f%s");
}

std::string format_bytes(double bytes) {
  return scaled(bytes, 1024.0, {" B", " KiB", " MiB", " GiB", " TiB", " PiB"}, "%.1f%s");
}

std::string gib_number(double bytes) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.2f", bytes / (1024.0 * 1024.0 * 1024.0));
  return text;
}

std::string format_gib(double bytes) { return gib_number(bytes) + " GiB"; }

std::string format_percent(double fraction, bool with_sign) {
  char text[64];
  std::snprintf(text, sizeof(text), with_sign ? "%+.1f%%" : "%.1f%%", 100 * fraction);
  return text;
}

}  // namespace megaplan
