// Import of Hugging Face `config.json` files (llama, mistral, qwen2 and gpt2 field names) into a
// ModelSpec, and the loader behind `--model NAME|FILE`.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "core/model_spec.h"

namespace megaplan {

// True when the object uses Hugging Face field names rather than Megatron's.
bool is_hf_config(const nlohmann::json& json);

// HF configs carry no training sequence length: seq_length defaults to max_position_embeddings
// (override it with --seq-length). Unknown HF fields are ignored, as transformers itself does;
// an unsupported model_type is a SpecError listing the supported ones.
ModelSpec model_spec_from_hf_config(const nlohmann::json& json, const std::string& source);

// `--model` resolves a preset name, or a path ending in .json holding either a megaplan model
// (Megatron argument names) or a Hugging Face config.json.
ModelSpec load_model_spec(const std::string& name_or_path);

}  // namespace megaplan
