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
// - The vocabulary: config.json's vocab_size is the true (unpadded) vocabulary and the embedding
//   and lm_head hold its rows: Megatron's padding belongs to a tensor-parallel layout, and
//   transformers' tokenizers index the true rows only. Read back, the rows are config.json's, and
//   a checkpoint written from them pads them for its layout (write_checkpoint_weights). A tied
//   output layer is the embedding (no lm_head).
// - The tokenizer: where the checkpoint records the one the run was trained with, its files are
//   copied beside the weights under transformers' names (tokenizer.json with the
//   tokenizer_config.json and special_tokens_map.json found beside it; tokenizer.model likewise;
//   GPT-2's vocab.json and merges.txt) and config.json names its bos_token_id and eos_token_id
//   where the tokenizer defines them; where it is unknown both are left out, and the export says so.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/model_spec.h"
#include "executor/data/tokenizer.h"
#include "executor/io/safetensors.h"

namespace megaplan::exec {

// transformers' default shard size (max_shard_size "5GB").
constexpr uint64_t kHfShardBytes = 5'000'000'000;

// The model type a model's architecture is written as: gpt2 for GPT's (LayerNorm, GELU, learned
// positions), qwen2 with QKV biases, else llama; with experts mixtral (experts in every layer, no
// shared expert, the top k's probabilities renormalised), else qwen2_moe. `requested` (mistral,
// ...) is checked against the architecture: SpecError("--model-type", ...) when that type cannot
// express it (transformers' routers: softmax over every expert, no capacity, bias or scaling).
std::string hf_model_type(const ModelSpec& model, const std::string& requested);

// What the export takes from the tokenizer a run was trained with.
struct HfTokenizerExport {
  std::optional<int64_t> bos_token_id, eos_token_id;  // config.json's, where the tokenizer defines them
  // Files to copy: (the file as recorded, its name in the export folder).
  std::vector<std::pair<std::string, std::string>> files;
  // One line for the command's output: which tokenizer, what was copied, and what is left out and
  // why ("the checkpoint records no tokenizer", a file that cannot be read now).
  std::string note;
};

// The export of `tokenizer` (nullopt: the checkpoint records none) for a model of `vocab_size`
// tokens. Reads the tokenizer's files (make_tokenizer) to find its ids; never throws for them:
// what cannot be read or lies outside the vocabulary is left out and said in `note`.
HfTokenizerExport hf_tokenizer_export(const std::optional<TokenizerOptions>& tokenizer, int64_t vocab_size);

// Writes `tensors` (Megatron's names and global shapes, as megaplan's checkpoints hold them, the
// vocabulary's padded or not; a tied output layer's copy ignored) as a Hugging Face directory of
// `type` in `dtype` (F32 or BF16), shards of at most `shard_bytes`: config.json (with the
// tokenizer's special ids), the safetensors files and the tokenizer's files. Returns how many
// Hugging Face tensors it wrote. Throws SpecError("--save", ...) when it cannot be written.
int64_t write_hf_checkpoint(const std::string& directory, const ModelSpec& model, const std::string& type,
                            const std::map<std::string, WholeTensor>& tensors, SafetensorsDtype dtype,
                            const HfTokenizerExport& tokenizer = {}, uint64_t shard_bytes = kHfShardBytes);

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
