#include "tests/fuzz/tiny_checkpoint.h"

#include <map>

#include "core/model_spec.h"
#include "core/parallel_plan.h"
#include "core/parameter_list.h"
#include "executor/train/checkpoint.h"

namespace megaplan::fuzz {

std::string write_tiny_checkpoint(const std::string& directory) {
  ModelSpec model;
  model.name = "fuzz-tiny";
  model.num_layers = 1;
  model.hidden_size = 8;
  model.ffn_hidden_size = 16;
  model.num_attention_heads = 2;
  model.seq_length = 8;
  model.vocab_size = 16;
  model.make_vocab_size_divisible_by = 8;
  model.swiglu = true;
  ParallelPlan plan;
  plan.tensor_parallel_size = 2;
  validate_model_spec(model);
  validate_plan(model, plan);
  std::map<std::string, exec::WholeTensor> tensors;
  float next = 0;
  for (const ParameterSpec& spec : describe_parameters(model, plan, 0)) {
    exec::WholeTensor& tensor = tensors[spec.name];
    tensor.shape = spec.global_shape;
    std::size_t count = 1;
    for (const int64_t extent : spec.global_shape) count *= static_cast<std::size_t>(extent);
    for (std::size_t i = 0; i < count; ++i) tensor.values.push_back(next += 0.25f);
  }
  exec::write_checkpoint_weights(directory, model, plan, tensors, 1);
  return directory + "/iter_0000000";
}

}  // namespace megaplan::fuzz
