#include "executor/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/text_file.h"

namespace megaplan::exec {

MappedFile::MappedFile(const std::string& path, const std::string& field) {
  require_regular_file(path, field);  // a FIFO would block the open
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw SpecError(field, path + ": cannot open: " + std::strerror(errno));
  struct stat status {};
  if (::fstat(fd, &status) != 0) {
    const int saved = errno;
    ::close(fd);
    throw SpecError(field, path + ": cannot stat: " + std::strerror(saved));
  }
  size_ = static_cast<std::size_t>(status.st_size);
  if (size_ > 0) {
    void* address = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (address == MAP_FAILED) {
      const int saved = errno;
      ::close(fd);
      throw SpecError(field, path + ": cannot map: " + std::strerror(saved));
    }
    data_ = static_cast<const unsigned char*>(address);
  }
  ::close(fd);  // the mapping stays valid
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::advise_random_access() const {
  // Advice only: where it is not taken, pages are read ahead as usual.
  if (data_) (void)::madvise(const_cast<unsigned char*>(data_), size_, MADV_RANDOM);
}

}  // namespace megaplan::exec
