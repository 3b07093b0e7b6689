// A job file (--plan FILE.json: model, cluster and parallel plan): the reader, validate_job as
// load_job runs it, and the same JSON after a write and a read.
#include <nlohmann/json.hpp>

#include "core/job_spec.h"
#include "core/json_io.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return megaplan::fuzz::refusing_only_with_spec_error([&] {
    const nlohmann::json json = megaplan::parse_json_text(megaplan::fuzz::as_text(data, size), "job.json");
    const megaplan::JobSpec job = megaplan::job_spec_from_json(json, "job.json");
    megaplan::validate_job(job);
    const nlohmann::json written = megaplan::job_spec_to_json(job);
    megaplan::fuzz::require(megaplan::job_spec_to_json(megaplan::job_spec_from_json(written, "written")) == written,
                            "a validated job changed on a write and a read");
  });
}
