// A file mapped read-only for as long as the object lives: datasets and their sample indexes,
// read where they lie, so that a file larger than memory costs nothing to open.
#pragma once

#include <cstddef>
#include <string>

namespace megaplan::exec {

class MappedFile {
 public:
  MappedFile() = default;
  // Throws SpecError(field, "PATH: cannot open|stat|map: REASON").
  MappedFile(const std::string& path, const std::string& field);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  std::size_t size() const { return size_; }
  // Pages are read as they are touched, without read-ahead: for files read at random places.
  void advise_random_access() const;

 private:
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace megaplan::exec
