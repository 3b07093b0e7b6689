#include "executor/train/expert_bias_state.h"

#include <cmath>
#include <cstddef>

#include "core/error.h"
#include "executor/train/host_values.h"

namespace megaplan::exec {

ExpertBiasState gather_expert_biases(const ModelSpec& model, const std::vector<StageChunk*>& chunks, Comm* pipeline,
                                     Backend& backend) {
  if (!model.moe.enabled() || !model.moe.router_enable_expert_bias) return {};
  const auto experts = static_cast<std::size_t>(model.moe.num_experts);
  // The rank's layers as one list, each its index and then its biases (a double holds a float exactly).
  std::vector<double> mine;
  for (StageChunk* chunk : chunks) {
    const StageChunk::ExpertBiases& held = chunk->expert_biases();
    std::vector<float> values(held.layers.size() * held.experts);
    if (!values.empty()) backend.download(values.data(), held.biases, values.size());
    for (std::size_t l = 0; l < held.layers.size(); ++l) {
      mine.push_back(static_cast<double>(held.layers[l]));
      mine.insert(mine.end(), values.begin() + static_cast<std::ptrdiff_t>(l * experts),
                  values.begin() + static_cast<std::ptrdiff_t>((l + 1) * experts));
    }
  }
  const std::vector<std::vector<double>> lists =
      pipeline ? all_gather_lists(*pipeline, backend, mine) : std::vector<std::vector<double>>{mine};
  ExpertBiasState biases;
  for (const std::vector<double>& list : lists) {
    for (std::size_t at = 0; at < list.size(); at += experts + 1) {
      std::vector<float>& bias = biases[static_cast<int64_t>(list[at])];
      for (std::size_t e = 0; e < experts; ++e) bias.push_back(static_cast<float>(list[at + 1 + e]));
    }
  }
  return biases;
}

void restore_expert_biases(const ExpertBiasState& biases, const ModelSpec& model, const std::string& source,
                           const std::vector<StageChunk*>& chunks, Backend& backend) {
  const bool expected = model.moe.enabled() && model.moe.router_enable_expert_bias;
  const std::string where = source + ": \"expert_biases\"";
  if (!expected) {
    if (!biases.empty()) throw SpecError("--load", where + " holds biases, but the run has no expert bias");
    return;
  }
  const auto experts = static_cast<std::size_t>(model.moe.num_experts);
  for (int64_t layer = 0; layer < model.num_layers; ++layer) {
    const bool moe = model.moe.moe_layer(layer);
    const auto found = biases.find(layer);
    if (moe && found == biases.end()) {
      throw SpecError("--load", where + " has no bias for MoE layer " + std::to_string(layer) +
                                    " (was it saved without --moe-router-enable-expert-bias?)");
    }
    if (!moe && found != biases.end()) {
      throw SpecError("--load", where + " has a bias for layer " + std::to_string(layer) + ", which has no experts");
    }
    if (!moe) continue;
    if (found->second.size() != experts) {
      throw SpecError("--load", where + " holds " + std::to_string(found->second.size()) + " biases for layer " +
                                    std::to_string(layer) + ", not one for each of its " + std::to_string(experts) +
                                    " experts");
    }
    for (const float value : found->second) {
      if (!std::isfinite(value)) {
        throw SpecError("--load", where + " holds a non-finite bias for layer " + std::to_string(layer));
      }
    }
  }
  if (biases.size() != static_cast<std::size_t>(model.moe.moe_layers(0, model.num_layers))) {
    throw SpecError("--load", where + " names a layer the model does not have");
  }
  for (StageChunk* chunk : chunks) {
    const StageChunk::ExpertBiases& held = chunk->expert_biases();
    for (std::size_t l = 0; l < held.layers.size(); ++l) {
      backend.upload(held.biases + l * held.experts, biases.at(held.layers[l]).data(), held.experts);
    }
  }
}

}  // namespace megaplan::exec
