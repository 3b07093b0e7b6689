// Hugging Face checkpoints of megaplan's models: a directory with config.json and model.safetensors
// (or, above 5 GB, model-0000K-of-0000N.safetensors with model.safetensors.index.json), as
// transformers' save_pretrained writes them, for the llama, mistral, qwen2 and gpt2 model types.
//
// Megatron's tensors and Hugging Face's hold the same numbers in other places:
// - Llama family: the fused QKV [groups x (queries, key, value) x dim] splits into q_proj, k_proj
//   and v_proj (and their biases, Qwen2's); fc1 [gate; up] into gate_proj and up_proj; the others
//   are renamed (input_layernorm, o_proj, post_attention_layernorm, down_proj, model.norm,
//   model.embed_tokens, lm_head). Both sides rotate halves of each head (Megatron's default RoPE and
//   transformers' rotate_half), so no head is permuted.
// - GPT-2: transformers' Conv1D layers store [in, out], the transpose of Megatron's [out, in]; the
//   fused QKV's columns are [all queries, all keys, all values] where Megatron keeps each head's q,
//   k and v together.
// - The vocabulary: the embedding's rows are config.json's vocab_size, which megaplan writes as its
//   padded vocabulary (every row round-trips); read back, the rows are config.json's, and a
//   checkpoint written from them pads them for its layout (write_checkpoint_weights). A tied
//   output layer is the embedding (no lm_head).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "core/model_spec.h"
#include "executor/io/safetensors.h"

namespace megaplan::exec {

// transformers' default shard size (max_shard_size "5GB").
constexpr uint64_t kHfShardBytes = 5'000'000'000;

// The model type a model's architecture is written as: gpt2 for GPT's (LayerNorm, GELU, learned
// positions), qwen2 with QKV biases, else llama. `requested` (mistral, ...) is checked against the
// architecture: SpecError("--model-type", ...) when that type cannot express it.
std::string hf_model_type(const ModelSpec& model, const std::string& requested);

// Writes `tensors` (Megatron's names and global shapes, as megaplan's checkpoints hold them; a tied
// output layer's copy ignored) as a Hugging Face directory of `type` in `dtype` (F32 or BF16),
// shards of at most `shard_bytes`. Throws SpecError("--save", ...) when it cannot be written.
void write_hf_checkpoint(const std::string& directory, const ModelSpec& model, const std::string& type,
                         const std::map<std::string, WholeTensor>& tensors, SafetensorsDtype dtype,
                         uint64_t shard_bytes = kHfShardBytes);

struct HfCheckpoint {
  ModelSpec model;
  // Megatron's names and global shapes, but the vocabulary's rows config.json's vocab_size.
  std::map<std::string, WholeTensor> tensors;
};

// Reads a Hugging Face directory back into Megatron's tensors. Throws SpecError("--load", ...)
// naming the file and the rule: a config megaplan does not read, a tensor missing or of another
// shape, a safetensors file that breaks the format.
HfCheckpoint read_hf_checkpoint(const std::string& directory);

}  // namespace megaplan::exec
