// The expert biases of aux-loss-free balancing (--moe-router-enable-expert-bias) as a checkpoint
// holds them: not parameters (no gradient, no moments) but state that the next forward reads, so a
// resumed run must route as the saved one would have. Every rank of a stage holds the same biases
// (each update sums the stage's counts), so they are kept once, by the model's layer index, in
// state.json: independent of the layout, as the weights are.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/model_spec.h"
#include "executor/comm/comm.h"
#include "executor/model/stage_chunk.h"
#include "executor/runtime/backend.h"

namespace megaplan::exec {

using ExpertBiasState = std::map<int64_t, std::vector<float>>;  // by layer index: [experts]

// Every MoE layer's expert bias of `model`, gathered over the pipeline group (null at pp 1) from the
// ranks' chunks: a collective over it, every member calling. Empty without expert biases.
ExpertBiasState gather_expert_biases(const ModelSpec& model, const std::vector<StageChunk*>& chunks, Comm* pipeline,
                                     Backend& backend);

// Sets the chunks' expert biases from a loaded state. Throws SpecError("--load", ...) naming the
// checkpoint (`source`) when it does not hold exactly the model's: a bias for every MoE layer of
// `model`, of its experts, finite; none when the model has no expert biases.
void restore_expert_biases(const ExpertBiasState& biases, const ModelSpec& model, const std::string& source,
                           const std::vector<StageChunk*>& chunks, Backend& backend);

}  // namespace megaplan::exec
