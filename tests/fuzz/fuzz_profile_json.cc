// A simulator profile (--profile FILE.json, profiles/README.md's schema): the reader, then one
// lookup of every kind the simulator makes, so that the measured tables the input carries are
// interpolated as they would be (below, inside and above a table's shapes).
#include <nlohmann/json.hpp>

#include "core/json_io.h"
#include "core/kernel_list.h"
#include "simulator/profile.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

using megaplan::CollectiveOp;
using megaplan::DType;
using megaplan::sim::LinkKind;

void look_up_everything(const megaplan::sim::Profile& profile) {
  megaplan::sim::CostSources sources;
  const megaplan::sim::LinkParams link{1e11, 5e-6};
  for (const int64_t size : {int64_t{1}, int64_t{4096}, int64_t{1} << 20}) {
    (void)profile.gemm_seconds(size, size, 1024, DType::kBFloat16, sources);
    (void)profile.gemm_seconds(megaplan::GemmLayout::kWeightGradient, megaplan::GemmEpilogue::kBias, size, 4096, 1024,
                               DType::kBFloat16, sources);
    (void)profile.attention_forward_seconds(size, 2048, 128, true, 4, false, sources);
    (void)profile.attention_backward_seconds(size, 2048, 128, true, 1, false, sources);
    (void)profile.elementwise_seconds(size * 1024, sources);
    for (const std::string& kernel_class : megaplan::memory_kernel_classes()) {
      (void)profile.memory_kernel_seconds(kernel_class, size * 1024, sources);
    }
    for (const LinkKind kind : {LinkKind::kNvlink, LinkKind::kNetwork}) {
      (void)profile.collective_seconds(CollectiveOp::kAllReduce, 8, size * 1024, kind, link, sources);
      (void)profile.collective_seconds(CollectiveOp::kAllToAll, 64, size, kind, link, sources);
      (void)profile.p2p_seconds(size * 1024, kind, link, sources);
      (void)profile.overlap_slowdown(CollectiveOp::kReduceScatter, 8, kind);
      (void)profile.p2p_overlap_slowdown(kind);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return megaplan::fuzz::refusing_only_with_spec_error([&] {
    const nlohmann::json json = megaplan::parse_json_text(megaplan::fuzz::as_text(data, size), "profile.json");
    const megaplan::sim::Profile profile = megaplan::sim::Profile::from_json(json, "profile.json");
    (void)profile.kind();
    look_up_everything(profile);
  });
}
