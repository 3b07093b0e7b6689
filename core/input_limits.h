// The largest sizes megaplan accepts, in one place. Each is far above any real model, cluster or
// run (the largest in the presets are noted) and small enough that the work and memory it drives —
// schedules, simulations, traces, data indexes, thread pools — stay within seconds and a few GiB
// on a laptop, so hostile or mistyped input is refused with one line before anything is
// allocated, never ground through or overflowed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.h"

namespace megaplan {

struct InputLimit {
  int64_t most;
  const char* why;  // what the bound protects, for the error line
};

// Model shape (gpt-1t: 128 layers, hidden 25600; llama3.1-405b: vocabulary 128256, 131072 positions).
inline constexpr InputLimit kMaxLayers{4096, "more than any model, and stage costs multiply it"};
inline constexpr InputLimit kMaxHiddenSize{1 << 20, "parameter counts multiply its square"};
inline constexpr InputLimit kMaxHeads{1 << 14, "attention costs multiply it"};
inline constexpr InputLimit kMaxExperts{1 << 14, "parameter counts multiply it"};
inline constexpr InputLimit kMaxSequenceLength{1 << 24, "activation sizes multiply it"};
inline constexpr InputLimit kMaxVocabulary{1 << 24, "embedding sizes multiply it"};
// Cluster and layout (the largest training clusters hold ~10^5 GPUs).
inline constexpr InputLimit kMaxWorldSize{1 << 18, "rank groups and layouts are enumerated over it"};
inline constexpr InputLimit kMaxGpusPerNode{1024, "more than any node"};
inline constexpr InputLimit kMaxNicsPerNode{64, "more than any node"};
// A batch: published runs use up to 15360 samples per iteration (DeepSeek-V3) and a few thousand
// microbatches; the planner walks every candidate's schedule, so its time grows with both.
inline constexpr InputLimit kMaxGlobalBatch{1 << 15, "samples per iteration, twice the largest published run's"};
inline constexpr InputLimit kMaxMicrobatches{1 << 14, "a schedule lists every microbatch of every stage"};
inline constexpr InputLimit kMaxPipelineStages{1024, "a schedule lists every stage"};
// Forward and backward actions of one pipeline's iteration (stages x microbatches x 2): what a
// schedule, its lowering, validation and simulation hold at once.
inline constexpr InputLimit kMaxScheduleActions{1 << 23,
                                                "a schedule's actions are held, lowered and simulated at once"};
// A Chrome trace writes every action of every pipeline rank (~200 bytes each).
inline constexpr InputLimit kMaxTraceActions{1 << 20, "a trace file writes every action"};
// Training: a split's sample indexes are cached on disk and mapped, but the shuffle of its samples
// is built in memory (Megatron's too), 4 bytes per sample up to 2^32 samples and 8 beyond: 2^34
// samples (128 GiB to shuffle) are 35 trillion tokens at seq 2048, twice Llama 3's 15 trillion.
inline constexpr InputLimit kMaxTrainingSamples{int64_t{1} << 34,
                                                "the samples' shuffle is built in memory, 8 bytes per sample"};
inline constexpr InputLimit kMaxThreads{1024, "one thread each"};
// data prepare: one document (a JSONL line or a text file) is tokenized in memory (~12 bytes per byte).
inline constexpr InputLimit kMaxDocumentBytes{int64_t{1} << 26, "a document is tokenized whole in memory"};

// Throws SpecError(field, "must be at most MOST (WHY), got VALUE").
inline void require_at_most(int64_t value, const InputLimit& limit, std::string_view field) {
  if (value <= limit.most) return;
  throw SpecError(std::string(field), "must be at most " + std::to_string(limit.most) + " (" + limit.why + "), got " +
                                          std::to_string(value));
}

}  // namespace megaplan
