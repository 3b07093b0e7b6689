// Notes: what a command, or the library it calls, chose for the user ("the global batch is 16"),
// said on stderr once the command has succeeded, so that a refused command still prints its one error line only and
// --json's stdout stays one document. A long run (train) says them before it starts.
#pragma once

#include <ostream>
#include <string>

namespace megaplan {

void note(const std::string& text);

// Writes each pending note as "note: TEXT" and forgets them.
void flush_notes(std::ostream& out);

}  // namespace megaplan
