// A torch.distributed.pipelining schedule CSV (schedule --import, simulate --schedule-csv), in
// either format: a compute-only one is validated, lowered and validated again, as `megaplan
// schedule --lowered` does; one with communication is validated as given.
#include <string>

#include "core/schedule/lowering.h"
#include "core/schedule/schedule_csv.h"
#include "core/schedule/validation.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return megaplan::fuzz::refusing_only_with_spec_error([&] {
    const megaplan::PipelineSchedule schedule =
        megaplan::parse_schedule_csv(std::string(megaplan::fuzz::as_text(data, size)), "schedule.csv");
    megaplan::validate_schedule(schedule);
    if (!schedule.lowered) megaplan::validate_schedule(megaplan::lower_schedule(schedule));
  });
}
