// Timelines as Chrome trace JSON (the Trace Event Format), which Perfetto and chrome://tracing
// load: one process per pipeline rank, one thread per stream, one complete ("X") slice per action
// named as the action is written ("0F3") with its microbatch and virtual stage as args, a flow
// arrow ("s" to "f") from each SEND to the RECV it pairs with; and such a trace read back
// (`megaplan compare`, `megaplan report`).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/job_spec.h"
#include "core/timeline.h"

namespace megaplan {

nlohmann::json timeline_to_chrome_trace(const Timeline& timeline);
// The same with the job's words: each slice's transformer layers and its work (FLOPs of compute,
// bytes of a transfer or reduction, core/action_work.h) in its args; a "memory" counter per rank
// (ph "C"): its model state (weights, gradients, optimizer state, runtime reserve, by the memory
// model) and the activations its forwards hold until their backwards free them, in GiB; and the
// model, the plan and megaplan's version in the trace's metadata (otherData).
// `collective_detail` (--trace-detail): each compute slice's tensor- and context-parallel
// collectives (TimelineSlice::collective_s) as slices of their own on a "tp/cp collectives" thread:
// each layer's share as two slices, after its attention and after its MLP block, where Megatron's
// layer issues them.
nlohmann::json timeline_to_chrome_trace(const Timeline& timeline, const JobSpec& job, bool collective_detail = false);

// The timeline a trace written by timeline_to_chrome_trace holds (`simulate --trace`, `train
// --trace`): its "X" events become slices; metadata, counters, flows and the collective detail are
// skipped. Throws SpecError naming
// `file` and the event ("S.json: traceEvents[12]: name: ...") when an event is not such a slice:
// a name that is no action, a thread that is not its action's stream, a negative time.
// Its metadata's identity, when it has one, becomes the timeline's.
Timeline timeline_from_chrome_trace(const nlohmann::json& trace, const std::string& file);

// What a trace of `job` records in its metadata ("identity") to name the run it is a timeline of:
// the model's spec, its name aside (a renamed copy is the same model), and the plan, every field of
// parallel_plan_to_json but the implementation and its options and --moe-imbalance, which a
// simulation may state apart from the run it is compared with.
nlohmann::json trace_identity(const JobSpec& job);
// Throws SpecError(flag, "FILE is a trace of another run than OTHER's: FIELD is X there, Y here")
// when `timeline` (read from FILE, its source) records an identity other than `expected`.
// Traces written before megaplan recorded one pass (their action lists are still compared).
void check_trace_identity(const Timeline& timeline, const nlohmann::json& expected, const std::string& flag,
                          const std::string& other);

}  // namespace megaplan
