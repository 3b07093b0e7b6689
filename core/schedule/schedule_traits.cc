// The schedule-kind table and the shape rules it implies, with their messages.
#include "core/schedule/schedule_traits.h"

#include <string>

#include "core/error.h"
#include "core/schedule/generators.h"

namespace megaplan {

namespace {

using enum StagePlacement;
using enum StagesPerRank;
using enum MicrobatchRule;

// Checked against the generators' output in tests/core/schedule/schedule_traits_test.cc.
constexpr ScheduleTraits kTraits[] = {
    // kind                      spelling       placement stages   split  pp-only microbatches        megatron torch
    {ScheduleKind::kGPipe, "gpipe", kLoop, kOne, false, true, kAny, false, "GPipe"},
    {ScheduleKind::kOneFOneB, "1f1b", kLoop, kOne, false, false, kAny, true, "1F1B"},
    {ScheduleKind::kInterleaved, "interleaved", kLoop, kVirtual, false, true, kInterleavedGroups, true,
     "Interleaved1F1B"},
    // With one stage per rank, torch's InterleavedZeroBubble is the paper's ZB-H1.
    {ScheduleKind::kZeroBubbleH1, "zb-h1", kLoop, kOne, true, true, kAny, false, "InterleavedZeroBubble"},
    {ScheduleKind::kZeroBubbleV, "zbv", kV, kTwo, true, true, kAny, false, "ZBVZeroBubble"},
    {ScheduleKind::kDualPipeV, "dualpipev", kV, kTwo, true, true, kTwicePipeline, false, "DualPipeV"},
};

// Table rows are looked up by index: keep them in the enum's order.
constexpr bool table_in_enum_order() {
  for (std::size_t i = 0; i < std::size(kTraits); ++i) {
    if (static_cast<std::size_t>(kTraits[i].kind) != i) return false;
  }
  return true;
}
static_assert(table_in_enum_order(), "kTraits must list every ScheduleKind in declaration order");

// The first rule a shape breaks, so that the predicate and the messages are one list.
enum class BrokenRule { kNone, kStagesPerRank, kMicrobatches };

BrokenRule first_broken_rule(const ScheduleTraits& traits, int64_t pipeline_parallel_size,
                             int64_t virtual_pipeline_size, int64_t microbatches, int64_t group_size) {
  switch (traits.stages_per_rank) {
    case kOne:
      if (virtual_pipeline_size != 1) return BrokenRule::kStagesPerRank;
      break;
    case kVirtual: break;  // interleaving's vpp >= 2 is checked with its microbatch groups, in Megatron's order
    case kTwo:
      if (virtual_pipeline_size != 2) return BrokenRule::kStagesPerRank;
      break;
  }
  switch (traits.microbatch_rule) {
    case kAny: break;
    case kInterleavedGroups:
      if (!interleaved_shape_ok(pipeline_parallel_size, virtual_pipeline_size, microbatches, group_size)) {
        return BrokenRule::kMicrobatches;
      }
      break;
    case kTwicePipeline:
      if (microbatches < 2 * pipeline_parallel_size) return BrokenRule::kMicrobatches;
      break;
  }
  return BrokenRule::kNone;
}

}  // namespace

std::span<const ScheduleTraits> all_schedule_traits() { return kTraits; }

const ScheduleTraits& schedule_traits(ScheduleKind kind) { return kTraits[static_cast<std::size_t>(kind)]; }

int64_t default_virtual_pipeline_size(ScheduleKind kind) {
  return schedule_traits(kind).stages_per_rank == StagesPerRank::kTwo ? 2 : 1;
}

bool schedule_shape_ok(ScheduleKind kind, int64_t pipeline_parallel_size, int64_t virtual_pipeline_size,
                       int64_t microbatches, int64_t group_size) {
  return first_broken_rule(schedule_traits(kind), pipeline_parallel_size, virtual_pipeline_size, microbatches,
                           group_size) == BrokenRule::kNone;
}

void check_schedule_shape(ScheduleKind kind, int64_t pipeline_parallel_size, int64_t virtual_pipeline_size,
                          int64_t microbatches, int64_t group_size, ShapeFlags flags) {
  const ScheduleTraits& traits = schedule_traits(kind);
  const BrokenRule broken =
      first_broken_rule(traits, pipeline_parallel_size, virtual_pipeline_size, microbatches, group_size);
  if (broken == BrokenRule::kNone) return;  // before any string is built: validate_plan runs per candidate
  // A plan's messages and `megaplan schedule`'s have always differed in wording; tests pin both.
  const bool plan = flags == ShapeFlags::kPlan;
  const std::string name = traits.spelling;
  if (broken == BrokenRule::kStagesPerRank) {
    const char* const field = plan ? "--schedule" : "--vpp";
    const std::string vpp = std::to_string(virtual_pipeline_size);
    if (traits.stages_per_rank == kOne) {
      throw SpecError(field, name + " runs one stage per rank; needs vpp = 1, got " + vpp);
    }
    throw SpecError(field,
                    name + (plan ? " places" : " runs") + " two stages per rank in a V; needs vpp = 2, got " + vpp);
  }
  if (traits.microbatch_rule == kInterleavedGroups) {  // throws: interleaving words its own rules
    validate_interleaved_shape(pipeline_parallel_size, virtual_pipeline_size, microbatches, group_size,
                               plan ? "--global-batch-size" : "--microbatches");
  }
  const std::string twice_pp = std::to_string(2 * pipeline_parallel_size);
  const std::string m = std::to_string(microbatches);
  if (plan) {
    throw SpecError("--global-batch-size",
                    name + " needs at least 2 * pp = " + twice_pp + " microbatches per replica, got " + m);
  }
  throw SpecError("--microbatches",
                  name + " needs at least as many microbatches as stages (2 * pp = " + twice_pp + "), got " + m);
}

}  // namespace megaplan
