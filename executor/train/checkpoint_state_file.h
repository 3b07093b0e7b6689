// A checkpoint's state.json (the training state, the model, the saving plan, its rank
// directories) and finding the newest complete checkpoint in a directory.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/model_spec.h"
#include "core/parallel_plan.h"
#include "executor/train/checkpoint.h"
#include "executor/train/checkpoint_manifest.h"

namespace megaplan::exec::checkpoint_format {

// state.json of a checkpoint of `model` saved by `plan`, with its own checksum.
nlohmann::json checkpoint_meta(const TrainingState& state, const ModelSpec& model, const ParallelPlan& plan);

// The newest checkpoint under a directory: its state.json, training state and every saved shard.
struct Newest {
  std::string path;  // DIR/iter_...
  nlohmann::json meta;
  TrainingState state;
  std::map<std::string, std::vector<SavedShard>> saved;  // by tensor name
  // Without latest_checkpointed_iteration.txt: the newer iteration directories passed over, each
  // with what it lacks ("iter_0000040 (no state.json)").
  std::vector<std::string> incomplete;
};
// The checkpoint latest_checkpointed_iteration.txt names (or, without it, the newest complete
// iteration directory), nothing when there is none. Throws SpecError("--load", ...) for a damaged
// state.json or manifest, or iteration directories none of which is complete.
std::optional<Newest> find_newest(const std::string& directory);

}  // namespace megaplan::exec::checkpoint_format
