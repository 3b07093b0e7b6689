// A cluster file (--cluster FILE.json): the reader, the validation, the whole cluster selected as
// --gpus does, and the same JSON after a write and a read.
#include <nlohmann/json.hpp>

#include "core/cluster_spec.h"
#include "core/json_io.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return megaplan::fuzz::refusing_only_with_spec_error([&] {
    const nlohmann::json json = megaplan::parse_json_text(megaplan::fuzz::as_text(data, size), "cluster.json");
    const megaplan::ClusterSpec cluster = megaplan::cluster_spec_from_json(json, "cluster.json");
    megaplan::validate_cluster_spec(cluster);
    (void)megaplan::select_gpus(cluster, cluster.total_gpus());
    const nlohmann::json written = megaplan::cluster_spec_to_json(cluster);
    megaplan::fuzz::require(
        megaplan::cluster_spec_to_json(megaplan::cluster_spec_from_json(written, "written")) == written,
        "a validated cluster spec changed on a write and a read");
  });
}
