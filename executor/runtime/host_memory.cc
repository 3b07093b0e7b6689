#include "executor/runtime/host_memory.h"

#include <unistd.h>

#include <fstream>
#include <string>

namespace megaplan::exec {

int64_t host_available_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kilobytes = 0;
  std::string unit;
  while (meminfo >> key >> kilobytes >> unit) {
    if (key == "MemAvailable:") return kilobytes * 1024;
  }
  return static_cast<int64_t>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace megaplan::exec
