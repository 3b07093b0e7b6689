// What the executor's tests share: a scratch directory, a tiny GPT, a layout of it, a small corpus
// with structure a model learns quickly, and the losses a --log-file recorded.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/model_spec.h"
#include "core/parallel_plan.h"
#include "executor/data/prepare.h"

namespace megaplan::test {

// A fresh directory under /tmp, removed with everything in it at scope exit.
class ScratchDirectory {
 public:
  ScratchDirectory() {
    char pattern[] = "/tmp/megaplan-test-XXXXXX";
    path_ = ::mkdtemp(pattern);
  }
  ~ScratchDirectory() { std::filesystem::remove_all(path_); }
  ScratchDirectory(const ScratchDirectory&) = delete;
  ScratchDirectory& operator=(const ScratchDirectory&) = delete;
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// 2 layers, hidden 64, 4 heads, seq 32, the byte vocabulary with its end-of-document token.
inline ModelSpec tiny_gpt() {
  ModelSpec model;
  model.name = "tiny-gpt";
  model.num_layers = 2;
  model.hidden_size = 64;
  model.num_attention_heads = 4;
  model.seq_length = 32;
  model.vocab_size = 257;
  model.make_vocab_size_divisible_by = 64;
  return model;
}

// The multi-rank CPU tests' model: 4 layers (a pipeline of 2 or 4 stages), hidden 32, 2 heads (one
// per rank at tp 2), seq 16. Megatron pads the vocabulary to a multiple of
// make_vocab_size_divisible_by times tp: 129 pads the byte tokenizer's 257 to 258 at tp 1 and tp 2
// alike, so those layouts hold the same tensors.
inline ModelSpec four_layer_gpt() {
  ModelSpec model = tiny_gpt();
  model.num_layers = 4;
  model.hidden_size = 32;
  model.num_attention_heads = 2;
  model.seq_length = 16;
  model.make_vocab_size_divisible_by = 129;
  return model;
}

// The Llama family's tiny model, as the acceptance names it: 2 layers, hidden 64, 4 heads in 2
// query groups, SwiGLU, RMSNorm, RoPE, untied embeddings, no biases; seq 32, the byte vocabulary.
inline ModelSpec tiny_llama() {
  ModelSpec model = tiny_gpt();
  model.name = "tiny-llama";
  model.num_query_groups = 2;
  model.swiglu = true;
  model.normalization = Normalization::kRMSNorm;
  model.position_embedding_type = PositionEmbedding::kRope;
  model.untie_embeddings_and_output_weights = true;
  model.add_bias_linear = false;
  return model;
}

// The multi-rank tests' Llama: four_layer_gpt's shape with 4 heads of 8 in 2 query groups (one
// per rank at tp 2) and the Llama family's choices.
inline ModelSpec four_layer_llama() {
  ModelSpec model = tiny_llama();
  model.name = "four-layer-llama";
  model.num_layers = 4;
  model.hidden_size = 32;
  model.seq_length = 16;
  model.make_vocab_size_divisible_by = 129;
  return model;
}

// four_layer_llama with Qwen2's QKV biases and a head dimension of its own (16: the queries are
// wider than the stream), half of it rotated.
inline ModelSpec four_layer_qwen() {
  ModelSpec model = four_layer_llama();
  model.name = "four-layer-qwen";
  model.add_qkv_bias = true;
  model.kv_channels = 16;
  model.rotary_percent = 0.5;
  return model;
}

// four_layer_llama with Qwen3's query and key norms (each query and key head RMS-normalised over its
// dimensions before RoPE) and heads of 16 (the queries wider than the stream), no biases.
inline ModelSpec four_layer_qwen3() {
  ModelSpec model = four_layer_llama();
  model.name = "four-layer-qwen3";
  model.kv_channels = 16;
  model.qk_layernorm = true;
  return model;
}

// four_layer_qwen3 with Qwen3-MoE's layers after a dense one (mlp_only_layers [0]): 4 experts of
// width 16, each token to its top 2 renormalised (norm_topk_prob), with the switch loss; dropless.
inline ModelSpec four_layer_qwen3_moe() {
  ModelSpec model = four_layer_qwen3();
  model.name = "four-layer-qwen3-moe";
  model.moe.num_experts = 4;
  model.moe.ffn_hidden_size = 16;
  model.moe.router_topk = 2;
  model.moe.layer_pattern = {0, 1, 1, 1};
  model.moe.aux_loss_coeff = 0.01;
  return model;
}

// four_layer_llama with Mixtral's MoE layers on layers 0 and 2 (--moe-layer-freq 2: dense layers
// between): 4 SwiGLU experts of width 24, each token to its top 2 by softmax over the chosen
// logits, dropless, with the switch and z losses.
inline ModelSpec four_layer_mixtral() {
  ModelSpec model = four_layer_llama();
  model.name = "four-layer-mixtral";
  model.moe.num_experts = 4;
  model.moe.ffn_hidden_size = 24;
  model.moe.router_topk = 2;
  model.moe.layer_freq = 2;
  model.moe.aux_loss_coeff = 0.01;
  model.moe.z_loss_coeff = 0.001;
  return model;
}

// four_layer_llama with Qwen2-MoE's layers everywhere: 4 experts of width 16 by softmax over all
// experts before the choice, a shared expert of width 32 behind its sigmoid gate, the
// sequence-level aux loss, and a capacity of 1.5 routes an expert's share dropping the least
// probable routes, padded.
inline ModelSpec four_layer_qwen_moe() {
  ModelSpec model = four_layer_llama();
  model.name = "four-layer-qwen-moe";
  model.moe.num_experts = 4;
  model.moe.ffn_hidden_size = 16;
  model.moe.router_topk = 2;
  model.moe.router_pre_softmax = true;
  model.moe.shared_expert_intermediate_size = 32;
  model.moe.shared_expert_gate = true;
  model.moe.load_balancing = LoadBalancing::kSeqAuxLoss;
  model.moe.aux_loss_coeff = 0.01;
  model.moe.expert_capacity_factor = 1.5;
  model.moe.pad_expert_input_to_capacity = true;
  return model;
}

// four_layer_qwen_moe dropless (under tensor parallelism a capacity is each rank's own tokens',
// Megatron's, so no single rank's run to compare with): its sequence loss over each tp rank's
// whole sequences.
inline ModelSpec four_layer_dropless_qwen_moe() {
  ModelSpec model = four_layer_qwen_moe();
  model.name = "four-layer-dropless-qwen-moe";
  model.moe.expert_capacity_factor.reset();
  model.moe.pad_expert_input_to_capacity = false;
  return model;
}

// four_layer_qwen_moe with the switch and z losses, dropless: its gated shared expert under tensor
// parallelism with the tp group's counts and z loss.
inline ModelSpec four_layer_shared_expert_moe() {
  ModelSpec model = four_layer_qwen_moe();
  model.name = "four-layer-shared-expert";
  model.moe.load_balancing = LoadBalancing::kAuxLoss;
  model.moe.z_loss_coeff = 0.001;
  model.moe.expert_capacity_factor.reset();
  model.moe.pad_expert_input_to_capacity = false;
  return model;
}

// four_layer_llama with DeepSeek-V3's routing on every layer: 4 experts of width 16, each token to
// its top 2 by sigmoid scores, balanced by the aux-loss-free expert bias alone (no aux loss), moved
// by 1e-2 an update so that a few iterations move it visibly.
inline ModelSpec four_layer_balanced_moe() {
  ModelSpec model = four_layer_llama();
  model.name = "four-layer-balanced-moe";
  model.moe.num_experts = 4;
  model.moe.ffn_hidden_size = 16;
  model.moe.router_topk = 2;
  model.moe.score_function = RouterScoreFunction::kSigmoid;
  model.moe.router_enable_expert_bias = true;
  model.moe.router_bias_update_rate = 1e-2;
  model.moe.load_balancing = LoadBalancing::kNone;
  return model;
}

// A layout of tp x pp x dp ranks (vpp model chunks per pipeline rank) training microbatches of
// `micro_batch` in global batches of `global_batch`; the rest is ParallelPlan's defaults.
inline ParallelPlan layout(int64_t tp, int64_t pp, int64_t dp, int64_t vpp, ScheduleKind schedule,
                           int64_t micro_batch = 2, int64_t global_batch = 8) {
  ParallelPlan plan;
  plan.tensor_parallel_size = tp;
  plan.pipeline_parallel_size = pp;
  plan.data_parallel_size = dp;
  plan.virtual_pipeline_parallel_size = vpp;
  plan.schedule = schedule;
  plan.micro_batch_size = micro_batch;
  plan.global_batch_size = global_batch;
  return plan;
}

// 40 documents of 20 sentences from a small grammar, prepared with the byte tokenizer (and
// end-of-document tokens) as Megatron names it, corpus_text_document.bin/.idx in `scratch`; returns
// that dataset's prefix (what --data-path takes).
inline std::string sentence_corpus(const ScratchDirectory& scratch) {
  const std::vector<std::string> subjects = {"the cat", "a dog", "my friend", "the old man", "a small bird"};
  const std::vector<std::string> verbs = {"sat on", "ran to", "looked at", "jumped over", "walked past"};
  const std::vector<std::string> objects = {"the mat", "the park", "a red car", "the river", "an open door"};
  std::mt19937 generator(3);
  exec::PrepareOptions prepare;
  for (int d = 0; d < 40; ++d) {
    std::string text;
    for (int s = 0; s < 20; ++s) {
      text += subjects[generator() % subjects.size()] + " " + verbs[generator() % verbs.size()] + " " +
              objects[generator() % objects.size()] + ". ";
    }
    const std::string path = scratch.file("doc" + std::to_string(d) + ".txt");
    std::ofstream(path) << text;
    prepare.inputs.push_back(path);
  }
  prepare.output_prefix = scratch.file("corpus");
  prepare.append_end_of_document = true;
  return exec::prepare_dataset(prepare, exec::ByteTokenizer()).datasets.front().prefix;
}

// One field of each training iteration's record in a run's JSON-lines log, in order (validation
// records, which carry no "loss", left out); NaN where the record holds null (the gradient norm of
// an iteration the loss scaler skipped).
inline std::vector<double> logged_iteration_values(const std::string& path, const std::string& field) {
  std::vector<double> values;
  std::ifstream log(path);
  std::string line;
  while (std::getline(log, line)) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (!record.contains("loss")) continue;
    // A field, or a JSON pointer into the record ("/tokens_per_expert_max_mean_by_layer/2").
    const nlohmann::json& value =
        field.starts_with("/") ? record.at(nlohmann::json::json_pointer(field)) : record.at(field);
    values.push_back(value.is_null() ? std::numeric_limits<double>::quiet_NaN() : value.get<double>());
  }
  return values;
}

inline std::vector<double> logged_losses(const std::string& path) { return logged_iteration_values(path, "loss"); }

}  // namespace megaplan::test
