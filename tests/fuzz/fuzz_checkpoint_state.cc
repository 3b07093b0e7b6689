// A checkpoint's state.json (convert --load DIR, train --load DIR): the input replaces the
// state.json of a real two-rank checkpoint, whose rank directories it may name, then
// read_checkpoint_weights reads it all (the state, the manifests, the shards, checksums included).
#include <string>

#include "executor/train/checkpoint.h"
#include "tests/fuzz/fuzz_support.h"
#include "tests/fuzz/tiny_checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string checkpoint = megaplan::fuzz::scratch_directory() + "/checkpoint";
  static const std::string iteration = megaplan::fuzz::write_tiny_checkpoint(checkpoint);
  megaplan::fuzz::write_file(iteration + "/state.json", megaplan::fuzz::as_text(data, size));
  return megaplan::fuzz::refusing_only_with_spec_error(
      [&] { (void)megaplan::exec::read_checkpoint_weights(checkpoint); });
}
