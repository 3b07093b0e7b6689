// The GPT of core's ModelSpec on a Backend: learned absolute positions, LayerNorm, GELU (tanh),
// tied input and output embeddings; fp32 master weights and gradients accumulated over
// microbatches, activations and each weight's compute copy in the backend's compute precision
// (bf16 on the GPU). One instance is one pipeline chunk: with pp = 1 the whole model (embedding, every
// layer, the output layer); the pipeline-parallel executor builds one per virtual stage. Every
// parameter says how tensor parallelism would split it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/model_spec.h"
#include "executor/runtime/backend.h"

namespace megaplan::exec {

// Megatron's splits: column-parallel (QKV, fc1: output rows), row-parallel (projection, fc2:
// input columns), vocabulary-parallel (embedding rows), or whole on every rank (norms, row biases).
enum class TensorSplit { kReplicated, kColumn, kRow, kVocabulary };

struct Parameter {
  std::string name;          // Megatron's, e.g. "decoder.layers.0.self_attention.linear_qkv.weight"
  std::vector<int64_t> shape;
  TensorSplit split = TensorSplit::kReplicated;
  bool weight_decay = true;  // off for biases and norms
  std::size_t size = 0;
  float* value = nullptr;    // fp32 master weight
  float* gradient = nullptr; // fp32, accumulated over microbatches
  float* first_moment = nullptr;
  float* second_moment = nullptr;
  Activation compute = nullptr;  // the weight in compute precision, as the layers read it
};

class GptModel {
 public:
  // Throws SpecError for what this backend's model does not support yet (RMSNorm, RoPE, SwiGLU,
  // GQA, untied embeddings, biases off). Weights: normal(0, 0.02), the projection and fc2 scaled
  // by 1/sqrt(2 * layers) as Megatron does; biases 0; norms 1 and 0.
  GptModel(const ModelSpec& model, int64_t micro_batch_size, Backend& backend, uint64_t seed);
  ~GptModel();
  GptModel(const GptModel&) = delete;
  GptModel& operator=(const GptModel&) = delete;

  // The bytes a model allocates on `backend` by the end of its first microbatch's backward:
  // weights, gradients, optimizer state, compute copies, scratch and one microbatch's activations.
  // The constructor refuses a model whose prediction exceeds the backend's available bytes.
  static int64_t predicted_bytes(const ModelSpec& model, int64_t micro_batch_size, const Backend& backend);

  std::vector<Parameter>& parameters() { return parameters_; }
  // Every parameter's buffers for the optimizer (weight decay off where the parameter says so).
  std::vector<OptimizerTensor> optimizer_tensors(double weight_decay) const;
  // After master weights change outside the optimizer (a checkpoint load).
  void refresh_compute_weights();
  int64_t vocab_size() const { return vocab_; }
  int64_t seq_length() const { return seq_; }
  int64_t micro_batch_size() const { return batch_; }

  // F: `tokens` holds micro_batch_size rows of seq_length + 1 tokens (inputs, then labels shifted
  // by one). Returns the masked mean loss and keeps the activations for backward(microbatch).
  double forward(int64_t microbatch, const std::vector<int64_t>& tokens, const std::vector<float>& loss_mask);
  // B: gradients of loss * loss_scale accumulate into every parameter's gradient; the
  // microbatch's activations are released.
  void backward(int64_t microbatch, float loss_scale);
  // The loss alone, keeping nothing (evaluation).
  double evaluate(const std::vector<int64_t>& tokens, const std::vector<float>& loss_mask);
  void zero_gradients();

 private:
  struct Layer {
    Parameter* ln1_gamma; Parameter* ln1_beta; Parameter* qkv_weight; Parameter* qkv_bias;
    Parameter* proj_weight; Parameter* proj_bias; Parameter* ln2_gamma; Parameter* ln2_beta;
    Parameter* fc1_weight; Parameter* fc1_bias; Parameter* fc2_weight; Parameter* fc2_bias;
  };
  // What the backward reads. The residual stream's sums (input, middle, output) are written by the
  // norms that follow them, which fuse the residual adds. The norms' outputs are not kept: the
  // backward recomputes them from the stream (one pass over tokens x hidden, against keeping
  // two such buffers per layer).
  struct LayerActivations {
    Activation input, qkv, attention, middle, fc1, gelu;
    float *ln1_mean, *ln1_rstd, *attention_saved, *ln2_mean, *ln2_rstd;
  };
  struct Activations {
    std::vector<int64_t> inputs, labels;
    std::vector<float> mask;
    std::vector<LayerActivations> layers;
    Activation output, final_norm, logits;  // logits: the loss's gradient overwrites them in the backward
    float *final_mean, *final_rstd, *loss_saved;
  };
  Parameter& add_parameter(const std::string& name, std::vector<int64_t> shape, TensorSplit split, bool decay);
  Activations allocate_activations();
  void release_activations(Activations& activations);
  double run_forward(Activations& activations, const std::vector<int64_t>& tokens, const std::vector<float>& mask);

  Backend& backend_;
  int64_t hidden_, heads_, layers_count_, ffn_, seq_, vocab_, batch_;
  std::vector<Parameter> parameters_;
  Parameter* word_embeddings_ = nullptr;
  Parameter* position_embeddings_ = nullptr;
  Parameter* final_gamma_ = nullptr;
  Parameter* final_beta_ = nullptr;
  std::vector<Layer> layers_;
  std::map<int64_t, Activations> in_flight_;  // by microbatch, from F until B
  std::vector<Activations> spare_;            // released activations, reused
  // Scratch, one set, as F and B each run whole: a norm's output until the linear layer after it
  // reads it; a branch's output until the next norm adds it to the residual stream; the backward's
  // gradients (d_residual_ ping-pongs between two buffers).
  Activation norm_out_, branch_out_, d_hidden_, d_residual_[2], d_qkv_, d_ffn_;
};

}  // namespace megaplan::exec
