// Plain-text tables.
#include "core/text_table.h"

#include <algorithm>
#include <cctype>
#include <stdexcept>

namespace megaplan {

namespace {

bool looks_numeric(const std::string& cell) {
  if (cell.empty()) return false;
  const unsigned char first = static_cast<unsigned char>(cell[0]);
  return std::isdigit(first) || ((cell[0] == '-' || cell[0] == '.') && cell.size() > 1);
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
    for (std::size_t column = 0; column < row.size(); ++column)
      widths[column] = std::max(widths[column], row[column].size());
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

}  // namespace megaplan
