// A cached sample index file (executor/data/index_file.h): the input is the whole file. It is
// mapped and its framing checked, and every entry of every section its header lists is read: a
// header may only be refused, never lead a reader outside the file.
#include <string>

#include "executor/data/index_file.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = megaplan::fuzz::scratch_directory() + "/index.bin";
  megaplan::fuzz::write_file(path, megaplan::fuzz::as_text(data, size));
  return megaplan::fuzz::refusing_only_with_spec_error([&] {
    const megaplan::exec::MappedIndexFile file(path, "--data-cache-path");
    volatile uint64_t sink = 0;  // every entry really read
    for (const nlohmann::json& listed : file.header().at("sections")) {
      const megaplan::exec::PackedArray section = file.section(listed.at("name").get<std::string>());
      for (uint64_t i = 0; i < section.size(); ++i) sink = sink + section[i];
    }
  });
}
