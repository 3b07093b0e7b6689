// A checkpoint rank directory's manifest.json: the input replaces tensor-parallel rank 0's
// manifest of a real two-rank checkpoint (rank 1's stays as saved, so its shards must still join
// with what the input describes), then read_checkpoint_weights reads it all.
#include <string>

#include "executor/train/checkpoint.h"
#include "tests/fuzz/fuzz_support.h"
#include "tests/fuzz/tiny_checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string checkpoint = megaplan::fuzz::scratch_directory() + "/checkpoint";
  static const std::string iteration = megaplan::fuzz::write_tiny_checkpoint(checkpoint);
  megaplan::fuzz::write_file(iteration + "/mp_rank_00/manifest.json", megaplan::fuzz::as_text(data, size));
  return megaplan::fuzz::refusing_only_with_spec_error(
      [&] { (void)megaplan::exec::read_checkpoint_weights(checkpoint); });
}
