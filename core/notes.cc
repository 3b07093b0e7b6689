#include "core/notes.h"

#include <mutex>
#include <vector>

#include "core/error.h"

namespace megaplan {

namespace {

std::mutex notes_mutex;
std::vector<std::string>& pending() {
  static std::vector<std::string> notes;
  return notes;
}

}  // namespace

void note(const std::string& text) {
  const std::lock_guard<std::mutex> lock(notes_mutex);
  pending().push_back(text);
}

void flush_notes(std::ostream& out) {
  const std::lock_guard<std::mutex> lock(notes_mutex);
  for (const std::string& text : pending()) out << "note: " << printable_line(text) << "\n";
  pending().clear();
}

}  // namespace megaplan
