// A safetensors file (convert --load of a Hugging Face directory): the header's rules, then every
// tensor it names read and widened to fp32, as read_hf_checkpoint does.
#include <string>

#include "executor/io/safetensors.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = megaplan::fuzz::scratch_directory() + "/model.safetensors";
  megaplan::fuzz::write_file(path, megaplan::fuzz::as_text(data, size));
  return megaplan::fuzz::refusing_only_with_spec_error([&] {
    const megaplan::exec::SafetensorsHeader header = megaplan::exec::read_safetensors_header(path, "--load");
    for (const auto& [name, entry] : header.tensors) {
      const megaplan::exec::WholeTensor tensor = megaplan::exec::read_safetensors_tensor(header, name, "--load");
      megaplan::fuzz::require(tensor.shape == entry.shape, "a tensor read with another shape than its header's");
    }
  });
}
