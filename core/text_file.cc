#include "core/text_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace megaplan {

std::string read_text_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw SpecError(path, std::string("cannot read file: ") + std::strerror(errno));
  std::ostringstream contents;
  contents << file.rdbuf();
  if (file.bad()) throw SpecError(path, std::string("cannot read file: ") + std::strerror(errno));
  return contents.str();
}

}  // namespace megaplan
