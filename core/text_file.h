// Reading a whole input file, with the one error line the CLI prints when it cannot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace megaplan {

// Throws SpecError(field, ...) where `path` exists and is not a regular file: a FIFO (which would
// block the open until a writer came), a device or a directory is not an input file.
void require_regular_file(const std::string& path, const std::string& field);

// Throws SpecError(path, "cannot read file: <reason>"), or require_regular_file's; also when the
// file holds more than `max_bytes` (a format's bound: a file linked to a huge one is refused, not
// read into memory).
std::string read_file_contents(const std::string& path, std::size_t max_bytes = SIZE_MAX);

// read_file_contents, noting the file as an input of this command (below): how the files a user
// names are read. Files megaplan itself keeps and replaces (a checkpoint's) use read_file_contents.
std::string read_text_file(const std::string& path);

// The files this process has read as input, by identity (device and inode, so any spelling or
// link of one names it): an output must never replace one (executor/io/staged_file.h).
void note_input_file(const std::string& path);
bool is_input_file(const std::string& path);
// Forgets them: for a process that runs one input after another (the fuzz targets, which would
// otherwise keep a record of every file they ever wrote and read).
void forget_input_files();

}  // namespace megaplan
