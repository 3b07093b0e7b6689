// TextTable: aligned plain-text tables for terminal output (numbers right-aligned, text left); the
// cells' units are core/units.h's.
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

}  // namespace megaplan
