// Schedule-kind traits: every fact about a ScheduleKind that more than one place needs (its
// spelling, where its stages sit, how many per rank, whether its backward splits, the shape rules
// it imposes) in one table. validate_plan, the generators, the planner's enumeration and the
// simulator's lower bound all ask it, so a new kind is one row here plus its generator.
#pragma once

#include <cstdint>
#include <span>

#include "core/parallel_plan.h"

namespace megaplan {

// How many virtual stages (model chunks) each pipeline rank runs.
enum class StagesPerRank : uint8_t {
  kOne,      // vpp must be 1
  kVirtual,  // the plan's vpp, at least 2: Megatron's interleaving (checked with its microbatch groups)
  kTwo,      // exactly 2, one on the V's way down and one on its way back up
};

// What the kind asks of the microbatch count M beyond M >= 1.
enum class MicrobatchRule : uint8_t {
  kAny,
  kInterleavedGroups,  // Megatron's: pp <= group <= M, and M % group is 0 or >= pp
  kTwicePipeline,      // M >= 2 * pp: DualPipeV feeds the pipeline from both ends
};

struct ScheduleTraits {
  ScheduleKind kind;
  const char* spelling;  // --schedule, --kind, plan JSON
  StagePlacement placement;
  StagesPerRank stages_per_rank;
  // The generator emits backwards split into I and W (ZB-H1 and ZBV all of them, DualPipeV those
  // of its warm-up and cool-down), so weight gradients can fill the pipeline's tail. Where false,
  // every backward is one B and the last microbatch's B crosses every stage before the step ends.
  bool splits_backward;
  // Only worth running with pp > 1: on one pipeline rank the kind is illegal (interleaved, the
  // V's) or runs 1F1B's work with no gain (gpipe, zb-h1), so the planner lists only 1f1b there.
  bool pipeline_only;
  MicrobatchRule microbatch_rule;
  // Megatron-LM runs the kind itself, chosen by --pipeline-model-parallel-size and
  // --num-layers-per-virtual-pipeline-stage; otherwise only torch.distributed.pipelining does.
  bool megatron_native;
  // torchtitan's --parallelism.pipeline_parallel_schedule (torch's class without "Schedule").
  const char* torch_schedule;
};

// Every kind, in ScheduleKind's order.
std::span<const ScheduleTraits> all_schedule_traits();
const ScheduleTraits& schedule_traits(ScheduleKind kind);

// The vpp a plan of `kind` takes when none is given: 2 for the V's (two chunks per rank, one down
// and one back up), else 1 (interleaving needs its vpp stated, as Megatron's flags state it).
int64_t default_virtual_pipeline_size(ScheduleKind kind);

// Whose flags a shape error names: a plan's (--schedule, --global-batch-size) or a bare
// generator's (--vpp, --microbatches: `megaplan schedule`).
enum class ShapeFlags : uint8_t { kPlan, kGenerator };

// True when `kind` runs on pp ranks of vpp stages each with M microbatches (interleaving in groups
// of `group_size`). Throws nothing: the planner asks it of every candidate before validate_plan.
// REQUIRES: pp, vpp, microbatches and group_size > 0.
bool schedule_shape_ok(ScheduleKind kind, int64_t pipeline_parallel_size, int64_t virtual_pipeline_size,
                       int64_t microbatches, int64_t group_size);

// Throws SpecError for the first rule of `kind` that the shape breaks (stages per rank, then
// microbatches), naming `flags`' flag; returns when schedule_shape_ok would say true.
// REQUIRES: as schedule_shape_ok.
void check_schedule_shape(ScheduleKind kind, int64_t pipeline_parallel_size, int64_t virtual_pipeline_size,
                          int64_t microbatches, int64_t group_size, ShapeFlags flags);

}  // namespace megaplan
