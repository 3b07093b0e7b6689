// torch.distributed.pipelining's schedule CSV (torchtitan's pipeline_parallel_schedule_csv): one row
// per pipeline rank, one action per cell in torch's text form. Two formats share the syntax:
// compute-only (F, B, I, W, OVERLAP_F_B) and compute with communication (plus SEND_*/RECV_*,
// REDUCE_GRAD); megaplan tells them apart by whether any communication action appears.
#pragma once

#include <string>

#include "core/parallel_plan.h"
#include "core/schedule/schedule.h"

namespace megaplan {

// One row per rank, cells joined by ',', no empty cells, a newline after every row.
std::string schedule_to_csv(const PipelineSchedule& schedule);

// Reads a schedule CSV. Empty cells (torch writes its idle steps that way) are skipped. The shape
// is inferred: pp = number of rows; stages = highest stage + 1, placed "loop" (stage % pp) or "v"
// (two stages per rank, zig-zag) as the rows show; microbatches = highest microbatch + 1.
// Throws SpecError naming "source:row:column" for an unknown action, "source:row" for a last row
// without a line ending (a file cut short), and `source` for a stage no row runs (a missing row)
// or stages on no consistent placement. The result is not validated (validate_schedule).
PipelineSchedule parse_schedule_csv(const std::string& text, const std::string& source);

// The compute-only schedule in the CSV at `path`, to run (or cost) in place of `plan`'s generated
// one (train --pipeline-schedule-csv, simulate --schedule-csv): it must have the plan's pipeline
// ranks, stages, microbatches and stage placement. Throws SpecError(flag, ...) naming what differs,
// or a schedule with communication in it (megaplan places that). Not lowered, not validated.
PipelineSchedule read_plan_schedule_csv(const std::string& path, const ParallelPlan& plan, const std::string& flag);

}  // namespace megaplan
