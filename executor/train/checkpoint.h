// Checkpoints as Megatron lays them out: DIR/iter_0000040/ per save and
// DIR/latest_checkpointed_iteration.txt naming the newest. A save is atomic: the iteration's
// directory is written under a temporary name, its files synced, then renamed; the "latest" file
// is replaced last. What is saved: every parameter's fp32 value and both Adam moments (model.bin,
// in the model's parameter order, checked by name and size on load) and the state that resumes
// the run exactly (state.json: iteration, consumed samples, seed, and the parameter list).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "executor/runtime/backend.h"
#include "executor/train/optimizer.h"

namespace megaplan::exec {

struct TrainingState {
  int64_t iteration = 0;         // updates done
  int64_t consumed_samples = 0;  // training samples drawn; the data position
  uint64_t seed = 0;             // the data order and the initialisation (no dropout: no other randomness)
};

// Throws SpecError("--save", ...) when the directory cannot be written.
void save_checkpoint(const std::string& directory, const TrainingState& state,
                     const std::vector<ParameterState>& parameters, Backend& backend);

// The newest checkpoint under `directory`, or nothing when it holds none. Throws
// SpecError("--load", ...) for an unreadable or inconsistent one (another model's parameters).
std::optional<TrainingState> load_checkpoint(const std::string& directory, const std::vector<ParameterState>& parameters,
                                             Backend& backend);

}  // namespace megaplan::exec
